"""A built-in multi-turn environment: guess a secret number from higher / lower feedback."""

from __future__ import annotations

import random
import re

from undertow.schemas import Task

from undertow.rollout.workflows.environment import StepResult, environment


@environment("number_guess")
class NumberGuess:
    """Guess the secret in [low, high]; each wrong guess is answered "higher" or "lower".

    The secret is the task's answer when it is an integer, else drawn from the task id (so a
    redelivered task replays the same game). Reward 1 for finding it; `step_penalty` per wrong guess.
    A binary search needs about log2(high - low + 1) turns: several, by design.
    """

    def __init__(self, *, low: int = 1, high: int = 100, step_penalty: float = 0.0):
        if low >= high:
            raise ValueError(f"number_guess: low ({low}) must be below high ({high})")
        self.low, self.high, self.step_penalty = low, high, step_penalty
        self.secret: int | None = None

    def reset(self, task: Task) -> str:
        answer = (task.answer or "").strip()
        self.secret = int(answer) if re.fullmatch(r"-?\d+", answer) else random.Random(task.task_id).randint(
            self.low, self.high)
        return task.prompt or f"Guess my number between {self.low} and {self.high}. Answer with one number."

    def step(self, action: str) -> StepResult:
        if self.secret is None:
            raise RuntimeError("number_guess: step() before reset()")
        found = re.findall(r"-?\d+", action)
        if not found:
            return StepResult("Answer with one number.", -self.step_penalty, False)
        guess = int(found[-1])
        if guess == self.secret:
            return StepResult("correct", 1.0, True)
        return StepResult("higher" if guess < self.secret else "lower", -self.step_penalty, False)
