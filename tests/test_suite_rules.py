"""Rules the suite keeps about itself: a wait inside a test ends before the test's time limit, so
that its message (the run's output, the components' logs) is what a failure shows, not pytest-timeout's
stack dump. (Every test that uses a broker carries the `broker` marker: tests/conftest.py refuses to
collect one that does not.)"""

from __future__ import annotations

import ast
import functools
import json
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


# -- waits end on conditions -------------------------------------------------------------------

def calls_named(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == name


def own_nodes(func: ast.AST):
    """The nodes of `func`'s body, not those of functions or lambdas defined inside it (they run elsewhere)."""
    todo = list(ast.iter_child_nodes(func))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def loop_lines(func: ast.AST) -> set[int]:
    """Every line inside a `while` or `for` loop of `func`: a sleep there paces a condition loop."""
    return {n.lineno for loop in own_nodes(func) if isinstance(loop, (ast.While, ast.For))
            for n in ast.walk(loop) if hasattr(n, "lineno")}


@functools.lru_cache(maxsize=None)
def functions(source: str) -> list[ast.FunctionDef]:
    """Every function of a module's source, nested ones included (parsed once for all the rules)."""
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def sleeps_then_asserts(source: str) -> list[str]:
    """A `time.sleep` outside any loop with an `assert` after it in the same function: the assertion bets
    that the system got somewhere within a duration. Wait for the condition (helpers.wait_for), or, to
    show that something does not happen, check it throughout the window (helpers.holds_for)."""
    found = []
    for func in functions(source):
        in_loop = loop_lines(func)
        nodes = list(own_nodes(func))
        asserts = [n.lineno for n in nodes if isinstance(n, ast.Assert)]
        for node in nodes:
            if calls_named(node, "sleep") and node.lineno not in in_loop and any(a > node.lineno for a in asserts):
                found.append(f"{func.name}:{node.lineno}")
    return sorted(found)


def silent_waits(source: str) -> list[str]:
    """Waits that would fail without saying what they waited for: a `wait_for` call that names no
    `what`, and a hand-made deadline loop (`while … time.monotonic() …`), which says nothing when it
    expires unless the code after it does; helpers.wait_for is the one loop that always does."""
    found = []
    for func in functions(source):
        for node in own_nodes(func):
            if calls_named(node, "wait_for") and not ast.unparse(node.func).startswith("asyncio") \
                    and len(node.args) < 3 and "what" not in {k.arg for k in node.keywords}:
                found.append(f"{func.name}:{node.lineno} wait_for without `what`")
            if isinstance(node, ast.While) and any(calls_named(n, "monotonic") or getattr(n, "id", "") == "deadline"
                                                   for n in ast.walk(node.test)):
                found.append(f"{func.name}:{node.lineno} a deadline loop of its own")
    return sorted(found)


def rule_breaks(rule) -> dict[str, list[str]]:
    helpers = {ROOT / "tests" / "helpers.py", Path(__file__).resolve()}  # the loops the rules point to
    return {str(p.relative_to(ROOT)): found for p in sorted((ROOT / "tests").rglob("*.py"))
            if p not in helpers and (found := rule(p.read_text()))}


def test_no_assertion_bets_on_a_sleep():
    found = rule_breaks(sleeps_then_asserts)
    assert not found, f"sleeps followed by assertions (wait for the condition instead): {found}"


def test_every_wait_says_what_it_waited_for():
    found = rule_breaks(silent_waits)
    assert not found, f"waits that fail without a message (use tests.helpers.wait_for(..., what=...)): {found}"


def test_the_wait_rules_see_a_bet_and_a_silent_wait():
    source = ("import time\n"
              "def test_a(p):\n    p.start()\n    time.sleep(2)\n    assert p.done\n"
              "def test_b(p):\n    while not p.done:\n        time.sleep(0.1)\n    assert p.ok\n"
              "def test_c(p):\n    def later():\n        time.sleep(1)\n    assert p.ok\n"
              "def test_d(p):\n    wait_for(lambda: p.done, 30)\n    wait_for(lambda: p.done, 30, 'p done')\n"
              "    deadline = time.monotonic() + 30\n    while not p.done and time.monotonic() < deadline:\n"
              "        pass\n")
    assert sleeps_then_asserts(source) == ["test_a:4"]
    assert silent_waits(source) == ["test_d:15 wait_for without `what`", "test_d:18 a deadline loop of its own"]


class _Config:
    """What xdist's LoadScheduling reads of a config: three workers, one test held besides the running one."""

    def __init__(self, base: Path):
        self._tmp_path_factory = type("Factory", (), {"getbasetemp": lambda _self: base})()

    def getvalue(self, name: str):
        return ["3*popen"] if name == "tx" else None

    def getoption(self, name: str):
        return 1 if name == "maxschedchunk" else None


class _Node:
    def __init__(self, name: str):
        self.gateway = type("Gateway", (), {"id": name})()
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices


def test_workers_get_the_demos_readers_once_it_is_made_and_a_quick_test_behind_its_maker(tmp_path, monkeypatch):
    from tests.scheduling import TurnScheduling
    from tests.turns import DEMO_MADE, TURNS

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the controller's view
    tests = {"maker": [0, True], "soak": [1, True], "readme": [1, True], "vllm": [2, False], "smollm2": [2, False],
             "lane": [2, False], "quick_demo": [3, True], "quick": [3, False], "quick2": [3, False]}
    (tmp_path / TURNS).write_text(json.dumps(tests))
    sched = TurnScheduling(_Config(tmp_path))
    nodes = [_Node(f"gw{i}") for i in range(3)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, list(tests))
    sched.schedule()
    names = lambda node: [list(tests)[i] for i in node.sent]
    # Before the demo's run exists nothing that reads it is sent but its maker, which gets a quick test behind it.
    assert [names(n) for n in nodes] == [["maker", "quick"], ["vllm", "smollm2"], ["lane", "quick2"]]
    (tmp_path / DEMO_MADE).write_text("{}")
    sched.mark_test_complete(nodes[1], nodes[1].sent[0])  # vllm ends: the worker gets the first reader
    assert names(nodes[1])[-1] == "soak"
