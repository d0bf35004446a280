"""A small text game: walk a frozen lake's grid to the goal without falling through a hole.

Like Gymnasium's FrozenLake (S start, F frozen, H hole, G goal; moves up / down / left / right),
as text: the policy sees the grid with its position and answers with one move per turn. Maps
come from the task (`task.metadata["grid"]`, rows of S F H G) or are drawn from the task id, so a
redelivered task replays the same game; a drawn map always has a path from S to G.
"""

from __future__ import annotations

import random
import re
from collections import deque

from undertow.schemas import Task

from undertow.rollout.workflows.environment import StepResult, environment

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


@environment("frozen_lake")
class FrozenLake:
    """Reach G in at most as many moves as the workflow's turns. Reward 1 at the goal; `hole_reward`
    for falling in (the episode ends); `step_penalty` per move that does not reach the goal."""

    def __init__(self, *, size: int = 4, holes: float = 0.2, step_penalty: float = 0.0, hole_reward: float = 0.0):
        if not 2 <= size <= 8:
            raise ValueError(f"frozen_lake: size must be in [2, 8], got {size}")
        self.size, self.holes, self.step_penalty, self.hole_reward = size, holes, step_penalty, hole_reward
        self.grid: list[str] = []
        self.pos = (0, 0)

    def reset(self, task: Task) -> str:
        grid = task.metadata.get("grid")
        self.grid = list(grid) if isinstance(grid, list) else draw_grid(self.size, self.holes, task.task_id)
        self.pos = next((r, c) for r, row in enumerate(self.grid) for c, cell in enumerate(row) if cell == "S")
        return (task.prompt or "Walk from S to G on the frozen lake; H is a hole. Answer with one move: "
                               "up, down, left or right.") + "\n" + self.render()

    def render(self) -> str:
        """The grid with P where the player stands."""
        r, c = self.pos
        return "\n".join(row[:c] + "P" + row[c + 1:] if i == r else row for i, row in enumerate(self.grid))

    def step(self, action: str) -> StepResult:
        if not self.grid:
            raise RuntimeError("frozen_lake: step() before reset()")
        found = re.findall(r"\b(up|down|left|right)\b", action.lower())
        if not found:
            return StepResult("Answer with one move: up, down, left or right.\n" + self.render(),
                              -self.step_penalty, False)
        dr, dc = MOVES[found[-1]]  # the last move named is the answer
        r = min(max(self.pos[0] + dr, 0), len(self.grid) - 1)  # walking into the edge: stay (as Gymnasium)
        c = min(max(self.pos[1] + dc, 0), len(self.grid[0]) - 1)
        self.pos = (r, c)
        cell = self.grid[r][c]
        if cell == "G":
            return StepResult("goal", 1.0, True)
        if cell == "H":
            return StepResult("hole", self.hole_reward, True)
        return StepResult(self.render(), -self.step_penalty, False)


def draw_grid(size: int, holes: float, seed: str) -> list[str]:
    """A size x size map from `seed`: S top-left, G bottom-right, holes where a path still exists."""
    rng = random.Random(f"frozen_lake/{seed}")
    while True:
        cells = [["H" if rng.random() < holes else "F" for _ in range(size)] for _ in range(size)]
        cells[0][0], cells[-1][-1] = "S", "G"
        grid = ["".join(row) for row in cells]
        if shortest_path(grid) is not None:
            return grid


def shortest_path(grid: list[str]) -> int | None:
    """Fewest moves from S to G avoiding holes (breadth-first search), None when G is cut off."""
    start = next((r, c) for r, row in enumerate(grid) for c, cell in enumerate(row) if cell == "S")
    seen, todo = {start}, deque([(start, 0)])
    while todo:
        (r, c), d = todo.popleft()
        if grid[r][c] == "G":
            return d
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < len(grid) and 0 <= nc < len(grid[0]) and (nr, nc) not in seen and grid[nr][nc] != "H":
                seen.add((nr, nc))
                todo.append(((nr, nc), d + 1))
    return None
