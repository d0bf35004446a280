"""Every built-in reward on a table of right and wrong answers, with hand-worked values."""

from __future__ import annotations

import pytest

from undertow.kernel.registry import RegistryError
from undertow.schemas import Task
from undertow.rollout.rewards import build_reward, total
from undertow.rollout.rewards.countdown import EquationError, evaluate


def task(answer: str | None = None, **metadata) -> Task:
    return Task(task_id="t", prompt="p", answer=answer, metadata=metadata)


@pytest.mark.parametrize("response, answer, expected", [
    ("The answer is 42", "42", 1.0),
    ("#### 1,234", "1234", 1.0),          # thousands comma, GSM8K marker
    ("\\boxed{-3.5}", "-3.5", 1.0),
    ("I think 41, no wait, 40", "42", 0.0),
    ("no number at all", "42", 0.0),
    ("answer: 7", "#### 7", 1.0),         # the reference's own marker is read too
])
def test_numeric_match(response, answer, expected):
    assert build_reward("numeric_match")(response, task(answer)) == {"correct": expected}


@pytest.mark.parametrize("response, answer, expected", [
    ("Answer: Paris", "paris", 1.0), ("paris ", "Paris", 1.0), ("Lyon", "Paris", 0.0), ("Paris", None, 0.0)])
def test_exact_match(response, answer, expected):
    assert build_reward("exact_match")(response, task(answer)) == {"exact": expected}


@pytest.mark.parametrize("response, answer, expected", [
    ("The answer is $\\boxed{\\frac{1}{2}}$", "1/2", 1.0),   # fraction = slash form
    ("so \\boxed{0.5}", "1/2", 1.0),                          # decimal = fraction
    ("\\boxed{2/4}", "\\frac{1}{2}", 1.0),                    # unreduced
    ("\\boxed{1+x}", "x+1", 1.0),                             # commutativity
    ("\\boxed{2}", "\\sqrt{4}", 1.0),                         # evaluated
    ("$\\boxed{\\{2,1\\}}$", "{1,2}", 1.0),                   # sets ignore order
    ("$\\boxed{3}$", "2", 0.0),
    ("no idea", "3", 0.0),
])
def test_math_verify_equivalences(response, answer, expected):
    assert build_reward("math_verify")(response, task(answer)) == {"math": expected}
    # as the worker calls it: on a thread, under rollout.reward_timeout_s (math-verify's own SIGALRM
    # timeout works on the main thread only)
    assert build_reward("math_verify", timeout_s=30)(response, task(answer)) == {"math": expected}


COUNTDOWN = dict(numbers=[3, 5, 7], target=22)


@pytest.mark.parametrize("response, correct", [
    ("3*5+7", 1.0),                                 # 15 + 7 = 22
    ("<answer>(7 + 5) * 3 - 14</answer>", 0.0),     # 14 is not given
    ("reasoning...\n7 + 3 * 5 = 22", 1.0),          # last line, '= 22' dropped
    ("(7+5)*3", 0.0),                               # 36
    ("3*5+7+3", 0.0),                               # 3 used twice
    ("3*7+5/5", 0.0),                               # 5 used twice (and 22 anyway)
    ("5*3", 0.0),                                   # 7 not used (use_all)
    ("__import__('os').system('true')", 0.0),       # a call: refused, never run
    ("3**5", 0.0),                                  # power is not allowed
    ("5*3+7+", 0.0),                                # does not parse
    ("3*5+7.0", 0.0),                               # floats are not given numbers
    ("7/(5-5)*3", 0.0),                             # division by zero
    ("-3+5*7", 0.0),                                # unary minus is not allowed
    ("9" * 300, 0.0),                               # too long to parse
])
def test_countdown(response, correct):
    assert build_reward("countdown")(response, task(**COUNTDOWN))["correct"] == correct


def test_countdown_exact_fractions_and_partial_use():
    # 7 / (5 - 3) * 4 = 14 exactly; with floats this would still work, but (1/3)*3 must be exactly 1.
    assert evaluate("7 / (5 - 3) * 4")[0] == 14
    assert evaluate("1/3*3")[0] == 1
    lenient = build_reward({"name": "countdown", "use_all": False})
    assert lenient("5*3", task(numbers=[3, 5, 7], target=15))["correct"] == 1.0
    with pytest.raises(EquationError, match="Call"):
        evaluate("print(1)")


def test_countdown_needs_numbers_and_target():
    with pytest.raises(ValueError, match="numbers"):
        build_reward("countdown")("1+2", task())


def test_format_and_weighted_combination():
    reward = build_reward({"name": "weighted", "terms": [
        {"name": "numeric_match", "weight": 1.0},
        {"name": "format", "pattern": r"\\boxed\{", "weight": 0.1}]})
    right = reward("\\boxed{4}", task("4"))
    assert right == {"correct": 1.0, "format": pytest.approx(0.1)}
    assert total(right) == pytest.approx(1.1)
    assert reward("4", task("4")) == {"correct": 1.0, "format": 0.0}
    assert total(reward("\\boxed{5}", task("4"))) == pytest.approx(0.1)


def test_custom_reward_by_dotted_path_and_bad_entries():
    reward = build_reward({"name": "tests.rollout.plugins.length_bonus", "per_char": 0.5})
    assert reward("abcd", task()) == {"length": 2.0}
    with pytest.raises(RegistryError, match="unexpected argument"):
        build_reward({"name": "numeric_match", "tolerence": 1})
    with pytest.raises(RegistryError, match="unknown"):
        build_reward("numeric_matc")
    with pytest.raises(TypeError, match="dict"):
        build_reward("tests.rollout.plugins.not_a_dict")("x", task())
