"""Countdown: reach a target with the given numbers and + - * /. Never eval()s model output.

The equation is parsed with `ast` and walked by hand; only number literals and the four binary
operators are accepted, arithmetic is exact (Fraction), and each given number may be used once.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction

from undertow.schemas import Task

from undertow.rollout.rewards.registry import reward

MAX_EQUATION_CHARS = 200  # a real answer is short; a long one is not worth parsing
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


class EquationError(ValueError):
    """Text that is not an equation of numbers and + - * /."""


def extract_equation(response: str) -> str:
    """The equation in a response: inside <answer>…</answer>, else the last line; '= target' dropped."""
    tagged = re.findall(r"<answer>(.*?)</answer>", response, re.S)
    text = tagged[-1] if tagged else (response.strip().splitlines() or [""])[-1]
    return text.split("=")[0].strip()


def evaluate(equation: str) -> tuple[Fraction, list[int]]:
    """The exact value of `equation` and the numbers it uses; EquationError when not allowed."""
    if len(equation) > MAX_EQUATION_CHARS:
        raise EquationError(f"longer than {MAX_EQUATION_CHARS} characters")
    try:
        tree = ast.parse(equation, mode="eval")
    except SyntaxError as e:
        raise EquationError(f"does not parse: {e.msg}") from None
    used: list[int] = []
    return _walk(tree.body, used), used


def _walk(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _walk(node.left, used), _walk(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise EquationError("division by zero")
        return _OPS[type(node.op)](left, right)
    raise EquationError(f"{type(node).__name__} is not allowed: only integers and + - * /")


@reward("countdown")
def countdown(response: str, task: Task, *, use_all: bool = True, format_value: float = 0.0) -> dict[str, float]:
    """1 when the equation reaches the target using the task's numbers at most once each (all of them
    when `use_all`). `format_value` is paid for any well-formed equation, right or wrong.

    The task carries `metadata = {"numbers": [...], "target": n}` (the feeder's countdown taskset).
    """
    numbers, target = task.metadata.get("numbers"), task.metadata.get("target")
    if not isinstance(numbers, list) or not isinstance(target, int):
        raise ValueError(f"task {task.task_id}: countdown needs metadata numbers (list) and target (int)")
    try:
        value, used = evaluate(extract_equation(response))
    except EquationError:
        return {"correct": 0.0, "format": 0.0}
    available, wanted = Counter(numbers), Counter(used)
    fair = not (wanted - available) and (not use_all or wanted == available)
    return {"correct": float(fair and value == target), "format": format_value}
