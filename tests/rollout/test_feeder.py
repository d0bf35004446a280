"""Task sources and the sampler: field mapping, procedural answers, mixing ratios, epochs, selectors."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from undertow.schemas import Task, TaskStat
from undertow.rollout.feeder import TaskItem, TaskSampler, difficulty_weight, item_key, load_items
from undertow.rollout.feeder.sampler import Taskset, draw_index
from undertow.rollout.feeder.selectors import Bots
from undertow.rollout.rewards import build_reward
from undertow.rollout.rewards.countdown import evaluate

ROWS = [{"question": "1+1?", "solution": "so #### 2", "uid": "a", "level": 1},
        {"question": "2+2?", "solution": "so #### 4", "uid": "b", "level": 2}]
MAPPING = dict(fields={"prompt": "question", "answer": "solution", "id": "uid"}, answer_after="####", keep=["level"])


def check_rows(items: list[TaskItem]) -> None:
    assert [(i.key, i.prompt, i.answer, i.metadata) for i in items] == [
        ("a", "1+1?", "2", {"level": 1}), ("b", "2+2?", "4", {"level": 2})]


def save_dataset_dict(path, rows) -> None:
    """A DatasetDict with a 'train' split on disk: by `datasets` itself when installed, else its layout
    written by hand (dataset_dict.json, then per split state.json + Arrow stream files)."""
    try:
        from datasets import Dataset, DatasetDict
    except ImportError:
        split = path / "train"
        split.mkdir(parents=True)
        (path / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
        table = pa.Table.from_pylist(rows)
        with pa.ipc.new_stream(split / "data-00000-of-00001.arrow", table.schema) as writer:
            writer.write_table(table)
        (split / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
        return
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(path))


def test_jsonl_parquet_and_hf_disk_sources_map_fields(tmp_path):
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    check_rows(load_items({"name": "jsonl", "path": str(tmp_path / "t.jsonl"), **MAPPING}))
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "t.parquet")
    check_rows(load_items({"name": "parquet", "path": str(tmp_path / "t.parquet"), **MAPPING}))
    save_dataset_dict(tmp_path / "ds", ROWS)
    check_rows(load_items({"name": "hf_disk", "path": str(tmp_path / "ds"), "split": "train", **MAPPING}))
    with pytest.raises(ValueError, match="split"):
        load_items({"name": "hf_disk", "path": str(tmp_path / "ds"), "split": "test"})


def test_prompt_template_and_bad_input(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS))
    items = load_items({"name": "jsonl", "path": str(path), "prompt_template": "Q: {question} (level {level})"})
    assert items[1].prompt == "Q: 2+2? (level 2)" and items[1].key == "1"
    path.write_text('{"prompt": "ok"}\n{not json}\n')
    with pytest.raises(ValueError, match="line 2"):
        load_items({"name": "jsonl", "path": str(path)})
    path.write_text('{"other": 1}\n')
    with pytest.raises(ValueError, match="no prompt"):
        load_items({"name": "jsonl", "path": str(path)})
    with pytest.raises(ValueError, match="unknown task field"):
        load_items({"name": "jsonl", "path": str(path), "fields": {"question": "q"}})


def test_procedural_tasks_have_verifiable_answers():
    arith = load_items({"name": "arithmetic", "size": 50, "seed": 3})
    assert arith == load_items({"name": "arithmetic", "size": 50, "seed": 3})  # seeded
    assert arith != load_items({"name": "arithmetic", "size": 50, "seed": 4})
    numeric = build_reward("numeric_match")
    for item in arith:
        task = Task(task_id="t", prompt=item.prompt, answer=item.answer)
        assert numeric(f"#### {item.answer}", task) == {"correct": 1.0}
    countdown = build_reward("countdown")
    for item in load_items({"name": "countdown", "size": 50, "count": 4}):
        value, used = evaluate(item.answer)
        assert value == item.metadata["target"] and sorted(used) == item.metadata["numbers"]
        task = Task(task_id="t", prompt=item.prompt, metadata=item.metadata)
        assert countdown(item.answer, task)["correct"] == 1.0
    sums = load_items({"name": "sums", "size": 200, "max_operand": 9})
    assert sums[0] == load_items({"name": "sums", "size": 1})[0]
    for item in sums:
        a, b = item.metadata["operands"]
        assert item.prompt == f"{a}+{b}=" and item.answer == str(a + b) and 0 <= a <= 9 and 0 <= b <= 9
    assert len({item.prompt for item in sums}) > 50  # all 100 pairs are reachable, not a few


def items(n: int) -> list[TaskItem]:
    return [TaskItem(key=str(i), prompt=f"p{i}", answer=str(i)) for i in range(n)]


def test_mixing_ratios_hold_exactly_and_epochs_end_each_taskset():
    sampler = TaskSampler([Taskset("a", items(100), 3.0, 2), Taskset("b", items(100), 1.0, 4)], epochs=None)
    drawn = [sampler.next() for _ in range(400)]
    assert Counter(t.taskset for t in drawn) == {"a": 300, "b": 100}
    first = Counter(t.taskset for t in drawn[:10])
    assert abs(first["a"] - 7.5) <= 1  # within one task at every prefix, not just on average
    assert {t.group_size for t in drawn if t.taskset == "b"} == {4}

    sampler = TaskSampler([Taskset("a", items(3), 1.0, 1), Taskset("b", items(5), 1.0, 1)], epochs=2, seed=1)
    tasks = list(iter(sampler.next, None))
    assert Counter(t.taskset for t in tasks) == {"a": 6, "b": 10}
    a_items = [t.metadata["item"] for t in tasks if t.taskset == "a"]
    assert sorted(a_items[:3]) == sorted(a_items[3:]) == ["0", "1", "2"]  # each epoch: every item once
    assert len({t.task_id for t in tasks}) == 16  # unique per fed task
    assert [t.metadata["epoch"] for t in tasks if t.taskset == "a"] == [0, 0, 0, 1, 1, 1]


def test_shuffle_is_seeded_and_switchable():
    def order(seed, selector):
        s = TaskSampler([Taskset("a", items(20), 1.0, 1)], seed=seed, selector=selector)
        return [t.metadata["item"] for t in iter(s.next, None)]

    assert order(0, "shuffle") == order(0, "shuffle") != order(1, "shuffle")
    assert sorted(order(0, "shuffle"), key=int) == order(0, "sequential") == [str(i) for i in range(20)]


def test_difficulty_weight_hand_worked():
    assert difficulty_weight(0.5, 0.05) == pytest.approx(1.0)
    assert difficulty_weight(0.0, 0.05) == difficulty_weight(1.0, 0.05) == pytest.approx(0.05)
    assert difficulty_weight(0.25, 0.0) == pytest.approx(0.75)  # 4 * 1/4 * 3/4
    assert item_key("arith/17@203") == "arith/17"


def stat(task_id: str, attempts: int, successes: int) -> TaskStat:
    return TaskStat(task_id=task_id, taskset="a", attempts=attempts, successes=successes)


def test_difficulty_selection_favours_tasks_neither_solved_nor_failed():
    def share_of_medium(selector) -> float:
        sampler = TaskSampler([Taskset("a", items(3), 1.0, 1)], epochs=None, seed=0, selector=selector)
        sampler.update(stat("a/0@0", 8, 8))   # always solved
        sampler.update(stat("a/1@1", 8, 0))   # never solved
        sampler.update(stat("a/2@2", 4, 1))   # an older report of the same task id ...
        sampler.update(stat("a/2@2", 8, 4))   # ... replaced by the newer one: 4 of 8
        drawn = [sampler.next().metadata["item"] for _ in range(600)]
        return drawn.count("2") / len(drawn)

    # Weights 0.05, 0.05, 1.0: the medium task gets 1 / 1.1 = 0.909 of the draws; without selection 1/3.
    assert share_of_medium({"name": "difficulty", "min_attempts": 4, "floor": 0.05}) == pytest.approx(1 / 1.1, abs=0.04)
    assert share_of_medium("shuffle") == pytest.approx(1 / 3, abs=0.01)


def test_pass_rates_add_up_per_item_across_epochs_and_need_min_attempts():
    def share_of_item_0(*stats: TaskStat) -> float:
        sampler = TaskSampler([Taskset("a", items(2), 1.0, 1)], epochs=None, selector="difficulty")
        for s in (stat("a/1@1", 8, 4), *stats):  # item 1 at pass rate 1/2: weight 1
            sampler.update(s)
        return [sampler.next().metadata["item"] for _ in range(400)].count("0") / 400

    sampler = TaskSampler([Taskset("a", items(2), 1.0, 1)], selector="difficulty")
    sampler.update(stat("a/0@0", 2, 2))
    sampler.update(stat("a/0@5", 2, 0))  # the same item, fed again later
    assert sampler.counts("a", TaskItem(key="0")) == (4, 2)
    # Two attempts, both solved: not trusted yet, weight 1 like item 1; four: weight 0.05 (0.05 / 1.05).
    assert share_of_item_0(stat("a/0@0", 2, 2)) == pytest.approx(0.5, abs=0.08)
    assert share_of_item_0(stat("a/0@0", 2, 2), stat("a/0@3", 2, 2)) == pytest.approx(0.05 / 1.05, abs=0.03)


def mixed_sampler(**kw) -> TaskSampler:
    return TaskSampler([Taskset("a", items(7), 2.0, 1), Taskset("b", items(5), 1.0, 1)], epochs=2, seed=3, **kw)


def test_a_restarted_sampler_continues_exactly_after_its_published_draws():
    first = mixed_sampler()
    published = [first.next() for _ in range(13)]  # into a's second epoch: a new shuffled order
    rest = [t.task_id for t in iter(first.next, None)]
    foreign = [Task(task_id="a/3@900", prompt="not item 3's prompt", taskset="a"),  # our form, not our content
               Task(task_id="c/0@0", prompt="x", taskset="c"),                       # a taskset we do not have
               Task(task_id="a/1", prompt=published[0].prompt, taskset="a"),           # no draw index
               Task(task_id="b/99@500", prompt="y", taskset="b")]                    # no such item
    again = mixed_sampler()
    drawn = again.published_draws(foreign[:2] + published[::-1] + foreign[2:])  # in any order
    assert drawn == {"a": sum(t.taskset == "a" for t in published), "b": sum(t.taskset == "b" for t in published)}
    assert again.skip(drawn) == 13
    assert [t.task_id for t in iter(again.next, None)] == rest
    assert mixed_sampler().published_draws(foreign) == {}


def test_with_difficulty_selection_a_restart_moves_the_draw_counters_on():
    sampler = mixed_sampler(selector="bots")
    assert sampler.skip({"a": 4, "b": 9}) == 13
    assert draw_index(sampler.next().task_id) in (4, 9) and draw_index("a/x@y") is None


def test_bots_posterior_hand_worked():
    bots = Bots(alpha0=1, beta0=1, max_evidence=4)
    assert bots.posterior(0, 0) == (1, 1)      # the prior: uniform
    assert bots.posterior(4, 1) == (2, 4)      # 1 success, 3 failures
    assert bots.posterior(8, 4) == (3, 3)      # 4 + 4 scaled to the cap of 4: 2 + 2
    assert Bots(max_evidence=None).posterior(8, 4) == (5, 5)


def test_easy_to_hard_orders_each_epoch_by_a_metadata_field_or_the_prompt_length():
    levels = [TaskItem(key=str(i), prompt="p" * (5 - i), metadata={"level": level})
              for i, level in enumerate([3, 1, 2, 1, 0])]
    by_level = TaskSampler([Taskset("a", levels, 1.0, 1)], epochs=2, selector={"name": "easy_to_hard", "by": "level"})
    assert [t.metadata["item"] for t in iter(by_level.next, None)] == ["4", "1", "3", "2", "0"] * 2
    by_length = TaskSampler([Taskset("a", levels, 1.0, 1)], selector="easy_to_hard")
    assert [t.metadata["item"] for t in iter(by_length.next, None)] == ["4", "3", "2", "1", "0"]
    with pytest.raises(ValueError, match="no metadata field 'lvl'"):
        TaskSampler([Taskset("a", levels, 1.0, 1)], selector={"name": "easy_to_hard", "by": "lvl"}).next()


@pytest.mark.parametrize("selector", ["difficulty", "bots"])
def test_the_curriculum_loop_shifts_draws_toward_tasks_of_intermediate_difficulty(selector):
    """The feeder's loop closed on outcomes: 30 items whose true pass rates are 0, 1/2 and 1 (ten
    each); each drawn task's group of 8 is scored by Bernoulli draws and reported back as a TaskStat,
    as the processors do. Shuffled, a third of the draws are intermediate; steered, most of the last 300."""
    truth = [0.0] * 10 + [0.5] * 10 + [1.0] * 10
    sampler = TaskSampler([Taskset("a", items(30), 1.0, 8)], epochs=None, seed=1, selector=selector)
    outcomes = __import__("random").Random(2)
    drawn = []
    for _ in range(1200):
        task = sampler.next()
        item = int(task.metadata["item"])
        drawn.append(item)
        successes = sum(outcomes.random() < truth[item] for _ in range(8))
        sampler.update(TaskStat(task_id=task.task_id, taskset="a", attempts=8, successes=successes))
    intermediate = lambda xs: sum(10 <= i < 20 for i in xs) / len(xs)
    assert intermediate(drawn[-300:]) > 0.75, intermediate(drawn[-300:])
    shuffled = TaskSampler([Taskset("a", items(30), 1.0, 8)], epochs=None, seed=1)
    assert intermediate([int(shuffled.next().metadata["item"]) for _ in range(300)]) == pytest.approx(1 / 3, abs=0.01)
