"""Contamination, measured on the prompts: checked against counts made by hand from the operands, not
against the function's own enumeration."""

from __future__ import annotations

from undertow.rollout.config import TasksetConfig
from undertow.rollout.contamination import contamination, heldout_items
from undertow.rollout.feeder.items import TaskItem


def taskset(label: str, **source) -> TasksetConfig:
    return TasksetConfig(name=label, source=source)


def test_a_small_generator_with_another_seed_draws_the_same_problems():
    heldout = heldout_items(taskset("h", name="sums", size=100, seed=1), None)
    assert contamination(heldout, [taskset("t", name="sums", size=5000, seed=0)]) == 1.0


def test_the_share_is_that_of_the_held_out_prompts_training_can_draw():
    """Training draws operands 0-4 only (25 sums, all of them in 5000 draws); the held-out sums
    have operands 0-9: exactly those with both operands <= 4 are contaminated."""
    heldout = heldout_items(taskset("h", name="sums", size=300, seed=3, max_operand=9), None)
    by_hand = sum(max(i.metadata["operands"]) <= 4 for i in heldout) / len(heldout)
    assert 0.1 < by_hand < 0.5  # a real mix, not an edge case
    assert contamination(heldout, [taskset("t", name="sums", size=5000, max_operand=4)]) == by_hand


def test_a_split_by_fact_is_held_out_and_max_tasks_counts_only_what_is_scored():
    train = taskset("t", name="arithmetic", split="train", size=3000, style="question", heldout_fraction=0.3)
    heldout = taskset("h", name="arithmetic", split="heldout", size=150, style="question", heldout_fraction=0.3,
                      distinct=True)
    assert contamination(heldout_items(heldout, None), [train]) == 0.0
    everything = taskset("a", name="arithmetic", size=3000, style="question", heldout_fraction=0.3)
    assert contamination(heldout_items(heldout, 50), [train, everything]) > 0.5  # the mix draws held-out facts too
    assert len(heldout_items(heldout, 50)) == 50


def test_a_prompt_is_its_text_and_its_messages(tmp_path):
    rows = tmp_path / "t.jsonl"
    rows.write_text('{"prompt": "hi", "answer": "1"}\n{"prompt": "yo", "answer": "2"}\n')
    heldout = heldout_items(taskset("h", name="jsonl", path=str(rows)), None)
    assert contamination(heldout, [taskset("t", name="jsonl", path=str(rows))]) == 1.0
    assert contamination(heldout, []) == 0.0
    chat = [TaskItem(key="0", prompt="hi", messages=[{"role": "system", "content": "be terse"}])]
    assert contamination(chat, [taskset("t", name="jsonl", path=str(rows))]) == 0.0  # same text, other messages
