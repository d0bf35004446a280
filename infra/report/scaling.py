"""The autoscaling signal: what an autoscaler (KEDA's Kafka scaler, an HPA on an external metric) reads
to size each stage, as `undertow status --json` prints it.

The rule (README, "Scaling out"): rollout workers follow the tasks lag of their group and the trainer's
wait fraction (a trainer that waits for data wants more rollout); processor workers follow the raw lag
of theirs; the trainer is not autoscaled (its ranks are fixed by its torchrun launch).
"""

from __future__ import annotations

from typing import Any

from undertow.infra.report.namespace import NamespaceStatus

WAIT_WINDOW = 20  # trainer steps the wait fraction is averaged over: recent enough to act on, not one step's noise


def lag_report(status: NamespaceStatus) -> dict[str, Any]:
    """Lag per consumer group (total and per topic) and per topic (the largest of its groups)."""
    groups: dict[str, dict[str, Any]] = {}
    per_topic: dict[str, int] = {}
    for reading in status.groups:
        entry = groups.setdefault(reading.group, {"lag": 0, "topics": {}})
        entry["lag"] += reading.lag
        entry["topics"][reading.topic] = {"lag": reading.lag, "committed": reading.committed, "end": reading.end}
        per_topic[reading.topic] = max(per_topic.get(reading.topic, 0), reading.lag)
    return {"policy_version": status.policy_version, "records": dict(sorted(status.records.items())),
            "groups": dict(sorted(groups.items())), "topic_lag": dict(sorted(per_topic.items()))}


def trainer_wait_fraction(rows: list[dict], window: int = WAIT_WINDOW) -> float | None:
    """Share of the trainer's recent wall time spent waiting for a batch: the sum of `wait_s` over its
    last `window` steps divided by the time those steps spanned (None: fewer than two steps reported)."""
    steps = [r for r in rows if r.get("component") == "trainer" and "wait_s" in r and "time" in r][-window - 1:]
    if len(steps) < 2:
        return None
    span = steps[-1]["time"] - steps[0]["time"]
    waited = sum(r["wait_s"] for r in steps[1:])  # each step's wait lies between it and the one before
    return None if span <= 0 else min(1.0, waited / span)
