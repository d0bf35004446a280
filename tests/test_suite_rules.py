"""Rules the suite keeps about itself: a wait inside a test ends before the test's time limit, so
that its message (the run's output, the components' logs) is what a failure shows, not pytest-timeout's
stack dump. (Every test that uses a broker carries the `broker` marker: tests/conftest.py refuses to
collect one that does not.)"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def suite_limit() -> float:
    return float(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"])


def marked_limit(decorators: list[ast.expr]) -> float | None:
    """M of a `pytest.mark.timeout(M)` among `decorators` (or a module's pytestmark list)."""
    for d in decorators:
        if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("mark.timeout") and d.args:
            return float(ast.literal_eval(d.args[0]))
    return None


def module_limit(tree: ast.Module, default: float) -> float:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            marks = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            return marked_limit(marks) or default
    return default


def long_waits(source: str, default: float) -> list[str]:
    """`timeout=N` literals in a test or fixture function that reach its time limit."""
    tree = ast.parse(source)
    limit = module_limit(tree, default)
    found = []
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    functions += [f for c in tree.body if isinstance(c, ast.ClassDef) for f in c.body if isinstance(f, ast.FunctionDef)]
    for func in functions:
        own = marked_limit(func.decorator_list) or limit
        for node in ast.walk(func):
            for kw in node.keywords if isinstance(node, ast.Call) else []:
                seconds = kw.value.value if isinstance(kw.value, ast.Constant) else None
                if kw.arg == "timeout" and isinstance(seconds, (int, float)) and seconds >= own:
                    found.append(f"{func.name}:{node.lineno} timeout={seconds} (limit {own:.0f} s)")
    return found


def test_no_wait_outlasts_its_tests_time_limit():
    default = suite_limit()
    found = {str(p.relative_to(ROOT)): w for p in sorted((ROOT / "tests").rglob("*.py"))
             if (w := long_waits(p.read_text(), default))}
    assert not found, f"waits as long as their test may run (pytest-timeout would speak first): {found}"


def test_the_rule_sees_a_long_wait_and_a_raised_limit():
    source = ("import pytest\n"
              "def test_a(): wait_run(p, r, timeout=900)\n"
              "@pytest.mark.timeout(1200)\n"
              "def test_b(): wait_run(p, r, timeout=900)\n")
    assert long_waits(source, 600) == ["test_a:2 timeout=900 (limit 600 s)"]
