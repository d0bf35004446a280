"""People in the loop: archived experiences out as Label Studio tasks, its annotations back as records.

Export (`undertow annotate export`): experiences selected by SQL over the archive (streams/replay.py's
Selection, in archive order) become Label Studio's import JSON, a list of `{"data": {...}}`, with the
labeling config to paste into the project beside it. Two modes:

- `rating`: one task per experience, rated 1..max_rating (`<Rating name="rating">`);
- `pairwise`: one task per two responses to the same prompt (samples 0-1, 2-3, ... of each group, in
  sample order), the better one picked (`<Pairwise name="preference">`).

Import (`undertow annotate import`): Label Studio's JSON export (each task with its `data` as exported
and `annotations`, each a `result` list of `{"type": "rating", "value": {"rating": 4}}` or
`{"type": "pairwise", "value": {"selected": "left"}}`; cancelled ones skipped) becomes:

- ratings: the experience again, its reward the annotators' mean rating mapped to [0, 1] as
  (r - 1) / (max_rating - 1) (1 star 0, max stars 1), component `human`, the model's reward kept in
  `metadata.model_reward`; `unprocessed` (streams/replay.py), for the raw topic, so the processors
  recompute advantages from the human rewards;
- pairwise: a PreferencePair, chosen by the majority of annotators (a tie is no pair), for the
  ready topic a DPO-family trainer reads.

A task whose experience the archive lacks, or that nobody annotated, is skipped and counted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

from undertow.schemas import Experience, PreferencePair, Record

Mode = Literal["rating", "pairwise"]
RATING, PREFERENCE = "rating", "preference"  # the control tags' names in the labeling configs


def label_config(mode: Mode, max_rating: int = 5) -> str:
    """The Label Studio labeling config (XML) the exported tasks are made for."""
    if mode == "rating":
        return ('<View>\n  <Header value="Prompt"/>\n  <Text name="prompt" value="$prompt"/>\n'
                '  <Header value="Response"/>\n  <Text name="response" value="$response"/>\n'
                f'  <Rating name="{RATING}" toName="response" maxRating="{max_rating}" required="true"/>\n</View>\n')
    return ('<View>\n  <Header value="Prompt"/>\n  <Text name="prompt" value="$prompt"/>\n'
            f'  <Pairwise name="{PREFERENCE}" toName="response_a,response_b"/>\n'
            '  <Text name="response_a" value="$response_a"/>\n  <Text name="response_b" value="$response_b"/>\n</View>\n')


def export_tasks(records: list[Experience], mode: Mode, max_rating: int = 5) -> list[dict[str, Any]]:
    """Label Studio tasks (import JSON) for `records`, in their order."""
    if mode == "rating":
        return [{"data": {"prompt": r.prompt_text, "response": r.response_text, "experience_id": r.experience_id,
                          "task_id": r.task_id, "policy_version": r.policy_version, "model_reward": r.reward,
                          "max_rating": max_rating}} for r in records]
    groups: dict[str, list[Experience]] = defaultdict(list)
    for r in records:
        groups[r.group_id].append(r)
    tasks = []
    for group in groups.values():
        group.sort(key=lambda r: r.sample_index)
        for a, b in zip(group[0::2], group[1::2]):
            tasks.append({"data": {"prompt": a.prompt_text, "response_a": a.response_text, "response_b": b.response_text,
                                   "id_a": a.experience_id, "id_b": b.experience_id, "task_id": a.task_id}})
    return tasks


@dataclass
class Verdict:
    """What the annotators of one Label Studio task said: ratings of one experience, or picks of a pair."""

    ids: tuple[str, ...]  # (experience_id,) or (id_a, id_b)
    ratings: list[float] = field(default_factory=list)
    picks: list[str] = field(default_factory=list)  # "left" / "right", one per annotator
    max_rating: int = 5
    task: Any = None  # Label Studio's task id


@dataclass
class Imported:
    """Records made from an export, and what was skipped, with why (one line each)."""

    records: list[Record] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def read_verdicts(export: list[dict[str, Any]]) -> tuple[list[Verdict], list[str]]:
    """The verdicts of a Label Studio JSON export, and a line for each task that has none."""
    verdicts, skipped = [], []
    for n, task in enumerate(export):
        where = f"task {task.get('id', n) if isinstance(task, dict) else n}"
        data = task.get("data") if isinstance(task, dict) else None
        if not isinstance(data, dict):
            skipped.append(f"{where}: no data (not a Label Studio task)")
            continue
        ids = (data["experience_id"],) if "experience_id" in data else (data.get("id_a"), data.get("id_b"))
        if not all(isinstance(i, str) and i for i in ids):
            skipped.append(f"{where}: data has neither experience_id nor id_a and id_b (exported by undertow?)")
            continue
        verdict = Verdict(ids, max_rating=int(data.get("max_rating", 5)), task=task.get("id"))
        for annotation in task.get("annotations") or []:
            if annotation.get("was_cancelled"):
                continue
            for item in annotation.get("result") or []:
                value = item.get("value") or {}
                if item.get("type") == "rating" and isinstance(value.get("rating"), (int, float)):
                    verdict.ratings.append(float(value["rating"]))
                elif item.get("type") == "pairwise" and value.get("selected") in ("left", "right"):
                    verdict.picks.append(value["selected"])
        if not verdict.ratings and not verdict.picks:
            skipped.append(f"{where}: not annotated")
            continue
        verdicts.append(verdict)
    return verdicts, skipped


def human_reward(ratings: list[float], max_rating: int) -> float:
    """The mean rating on [1, max_rating] mapped to [0, 1]."""
    mean = sum(ratings) / len(ratings)
    return (min(max(mean, 1.0), max_rating) - 1.0) / (max_rating - 1.0)


def rewarded(verdict: Verdict, exp: Experience) -> Experience:
    """`exp` with the human reward in place of the model's."""
    reward = human_reward(verdict.ratings, verdict.max_rating)
    meta = {**exp.metadata, "model_reward": exp.reward, "human_ratings": verdict.ratings,
            "label_studio_task": verdict.task}
    return exp.model_copy(update={"reward": reward, "reward_components": {"human": reward}, "metadata": meta})


def preferred(verdict: Verdict, a: Experience, b: Experience) -> PreferencePair | None:
    """The pair the majority picked (left is `a`); None on a tie."""
    left, right = verdict.picks.count("left"), verdict.picks.count("right")
    if left == right:
        return None
    chosen, rejected = (a, b) if left > right else (b, a)
    return PreferencePair(
        pair_id=f"{chosen.group_id}/{chosen.sample_index}>{rejected.sample_index}@human", task_id=chosen.task_id,
        prompt_text=chosen.prompt_text, prompt_tokens=chosen.prompt_tokens, chosen_text=chosen.response_text,
        chosen_tokens=chosen.response_tokens, rejected_text=rejected.response_text,
        rejected_tokens=rejected.response_tokens, policy_version=max(chosen.policy_version, rejected.policy_version),
        metadata={"votes": [max(left, right), left + right], "label_studio_task": verdict.task,
                  "group_id": chosen.group_id,
                  # the trainer refuses ids of another tokenizer (trainer/groups.py): keep the rollout's stamp
                  **({"tokenizer": chosen.metadata["tokenizer"]} if "tokenizer" in chosen.metadata else {})})


def import_verdicts(verdicts: list[Verdict], experiences: dict[str, Experience]) -> Imported:
    """Rewarded experiences (ratings) and preference pairs (picks) from the verdicts."""
    out = Imported()
    for v in verdicts:
        missing = [i for i in v.ids if i not in experiences]
        if missing:
            out.skipped.append(f"task {v.task}: experience(s) {missing} not in the archive")
        elif v.ratings:
            out.records.append(rewarded(v, experiences[v.ids[0]]))
        elif len(v.ids) == 2:
            pair = preferred(v, experiences[v.ids[0]], experiences[v.ids[1]])
            if pair is None:
                out.skipped.append(f"task {v.task}: a tie ({len(v.picks)} annotators)")
            else:
                out.records.append(pair)
        else:
            out.skipped.append(f"task {v.task}: a pairwise pick on one experience")
    return out
