"""Built-in tools."""

from __future__ import annotations

import ast
import operator

from undertow.rollout.tools.registry import tool

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}


@tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / // % and parentheses, e.g. "48213*7741"
    """
    value = _eval(ast.parse(expression, mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _eval(node: ast.AST) -> int | float:
    # Numbers and operators only: never eval() the model's text. Powers are left out on purpose
    # (9**9**9 would hang the child until its timeout).
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")
