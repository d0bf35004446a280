"""Built-in rewards: exact and numeric match, math answers (math-verify), format, weighted sums."""

from __future__ import annotations

import re
import threading
from typing import Any, Mapping

from undertow.schemas import Task

from undertow.rollout.rewards.registry import build_reward, reward

# A number as people write it: optional sign, thousands commas, decimals.
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def final_answer(response: str) -> str:
    """The part of a response that states its answer: after the last '####', in the last \\boxed{},
    after the last 'answer:', else the whole response."""
    if "####" in response:
        return response.rsplit("####", 1)[1].strip()
    boxed = BOXED.findall(response)
    if boxed:
        return boxed[-1].strip()
    lowered = response.lower()
    if "answer:" in lowered:
        return response[lowered.rindex("answer:") + len("answer:"):].strip()
    return response.strip()


def last_number(text: str) -> float | None:
    found = NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


@reward("exact_match")
def exact_match(response: str, task: Task, *, case_sensitive: bool = False) -> dict[str, float]:
    """1 when the final answer equals the task's answer (whitespace-trimmed)."""
    if task.answer is None:
        return {"exact": 0.0}
    got, want = final_answer(response), task.answer.strip()
    if not case_sensitive:
        got, want = got.lower(), want.lower()
    return {"exact": float(got == want)}


@reward("numeric_match")
def numeric_match(response: str, task: Task, *, tolerance: float = 1e-6) -> dict[str, float]:
    """1 when the last number of the final answer is within `tolerance` of the task's numeric answer."""
    want = last_number(task.answer or "")
    got = last_number(final_answer(response))
    ok = want is not None and got is not None and abs(got - want) <= tolerance * max(1.0, abs(want))
    return {"correct": float(ok)}


@reward("math_verify")
def math_verify(response: str, task: Task) -> dict[str, float]:
    """1 when math-verify finds the response's answer equivalent to the task's (LaTeX, fractions, sets, …)."""
    from math_verify import parse, verify

    if not task.answer:
        return {"math": 0.0}
    # math-verify times itself out with SIGALRM, which only the main thread may use; on another (the
    # worker calls rewards on a thread under rollout.reward_timeout_s, registry.py) that deadline rules.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    # A bare reference answer ("1/2", "\\sqrt{4}") parses reliably only inside math delimiters.
    gold = parse(task.answer if "$" in task.answer or "\\boxed" in task.answer else f"${task.answer}$",
                 parsing_timeout=limit)
    answer = parse(response, parsing_timeout=limit)
    # verify(gold, target): order matters to math-verify (the gold is the reference).
    return {"math": float(bool(gold) and bool(answer) and verify(gold, answer, timeout_seconds=limit))}


@reward("format")
def format_reward(response: str, task: Task, *, pattern: str = r"\\boxed\{[^{}]*\}", value: float = 1.0,
                  full_match: bool = False) -> dict[str, float]:
    """`value` when the response matches `pattern` (a regex; searched, or matched whole)."""
    flags = re.DOTALL
    hit = re.fullmatch(pattern, response.strip(), flags) if full_match else re.search(pattern, response, flags)
    return {"format": value if hit else 0.0}


@reward("weighted")
def weighted(response: str, task: Task, *, terms: list[Mapping[str, Any]]) -> dict[str, float]:
    """Components of several rewards, each scaled by its `weight` (default 1); names made unique.

    Config: `{name: weighted, terms: [{name: numeric_match, weight: 1.0}, {name: format, weight: 0.1}]}`.
    """
    out: dict[str, float] = {}
    for term in terms:
        spec = dict(term)
        weight = float(spec.pop("weight", 1.0))
        for key, value in build_reward(spec)(response, task).items():
            name = key if key not in out else f"{spec['name']}.{key}"
            out[name] = weight * value
    return out
