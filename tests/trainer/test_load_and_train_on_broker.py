"""A file of preference pairs trains with one command each (`undertow load CONFIG FILE --train`) on the
real broker, for DPO and KTO: the policy comes to prefer the chosen answers; and a file with bad rows is
refused whole, or with --skip-bad sent without them, each bad row on the rejected topic by its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from undertow.infra.cli import app
from undertow.schemas import MetricEvent, PreferencePair, Rejected
from undertow.streams import Topics

from tests.helpers import read_all, start_cli, write_config

pytestmark = pytest.mark.broker
STEPS = 6


def pairs_file(path: Path) -> Path:
    """8 sums: the answer chosen, a refusal rejected (characters of the tiny tokenizer)."""
    rows = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": "no"} for a, b in
            ((1, 2), (2, 3), (3, 1), (4, 4), (5, 2), (6, 1), (2, 7), (3, 5))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def trainer_metrics(kafka, namespace: str) -> list[dict[str, float]]:
    events = [m for m in read_all(kafka, Topics(namespace).metrics, expect=MetricEvent) if m.component == "trainer"]
    return [m.values for m in sorted(events, key=lambda m: m.step)]


def test_dpo_and_kto_train_on_a_pairs_file_with_one_command_each(kafka, namespace, tmp_path: Path):
    data = pairs_file(tmp_path / "pairs.jsonl")
    runs = {}
    for objective in ("dpo", "kto"):
        ns = f"{namespace}-{objective}"
        config = write_config(tmp_path / f"{objective}.yaml", ns, trainer={
            "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_every": 100,
            "engine": {"lr": 0.01}, "batching": {"experiences": 4, "max_wait_s": 1.0},
            "algorithm": {"objective": objective}})
        runs[ns] = start_cli("load", str(config), str(data), "--epochs", "3", "--train", "--max-steps", str(STEPS),
                             "--idle-timeout", "30")
    for ns, proc in runs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-5000:]
        assert f"loaded 24 pairs (8 rows × 3 epochs) to {ns}.experiences.ready" in out
        steps = trainer_metrics(kafka, ns)
        assert len(steps) == STEPS and all(s["records"] == 4 for s in steps), steps
        margins = [s["reward_margin"] for s in steps]
        accuracy = [s["preference_accuracy"] for s in steps]
        # Step 1 is taken with the policy still equal to its reference: margin 0, no pair preferred.
        assert margins[0] == pytest.approx(0.0, abs=1e-5) and accuracy[0] == 0.0
        assert min(margins[-2:]) > 0.5 and min(accuracy[-2:]) >= 0.75, (ns, margins, accuracy)
    # KTO moves each side against z0 on its own: the chosen answers' log-ratio to the reference above
    # it, the rejected ones' below (runs here: (chosen, z0, rejected) = (2.91, 1.58, 0.25), (3.52, 1.31, −0.91)).
    kto = trainer_metrics(kafka, f"{namespace}-kto")
    assert all(s["chosen_reward"] > max(s["kl"], 0.5) and s["rejected_reward"] < s["kl"] for s in kto[-2:]), kto


def test_bad_rows_refuse_the_file_or_go_to_the_rejected_topic_by_line(kafka, namespace, tmp_path: Path):
    data = tmp_path / "mixed.jsonl"
    data.write_text('{"prompt": "1+2=", "chosen": "3", "rejected": "no"}\n{"prompt": "2+2=", "chosen": "4"}\n'
                    'oops\n{"prompt": "3+3=", "chosen": "6", "rejected": "no"}\n')
    config = write_config(tmp_path / "dpo.yaml", namespace, trainer={"algorithm": {"objective": "dpo"}})
    topics = Topics(namespace)
    invoke = lambda *extra: CliRunner().invoke(app, ["load", str(config), str(data), *extra])

    refused = invoke()
    assert refused.exit_code == 2, refused.output
    assert "mixed.jsonl:2: missing rejected" in refused.output and "mixed.jsonl:3: not JSON" in refused.output
    assert "2 bad row(s) in mixed.jsonl; nothing was sent" in refused.output
    assert read_all(kafka, topics.ready) == [] and read_all(kafka, topics.rejected) == []

    sent = invoke("--skip-bad")
    assert sent.exit_code == 0, sent.output
    pairs = read_all(kafka, topics.ready, expect=PreferencePair)
    assert sorted(p.metadata["source"] for p in pairs) == ["mixed.jsonl:1", "mixed.jsonl:4"]
    rejected = sorted(read_all(kafka, topics.rejected, expect=Rejected), key=lambda r: r.record_id)
    assert [(r.stage, r.reason, r.record_id) for r in rejected] == [("load", "invalid", "mixed:2"), ("load", "invalid", "mixed:3")]
    assert rejected[1].original == b"oops" and rejected[1].detail.startswith("mixed.jsonl:3: not JSON")
