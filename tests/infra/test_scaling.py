"""The autoscaling signal's numbers, worked by hand."""

from __future__ import annotations

from undertow.infra.report.namespace import LagReading, NamespaceStatus
from undertow.infra.report.scaling import lag_report, trainer_wait_fraction


def test_wait_fraction_is_recent_waiting_over_recent_wall_time():
    rows = [{"component": "trainer", "time": t, "wait_s": w} for t, w in ((10, 0.5), (12, 1.0), (15, 1.5), (16, 0.5))]
    rows.insert(2, {"component": "rollout-0", "time": 13, "wait_s": 9.0})  # another component's wait is not the trainer's
    # steps at 10..16 span 6 s; the waits between them: 1.0 + 1.5 + 0.5 = 3.0 s -> 0.5
    assert trainer_wait_fraction(rows) == 0.5
    # the last 2 steps (times 12..16): 1.5 + 0.5 over 4 s; the last one (15..16): 0.5 over 1 s
    assert trainer_wait_fraction(rows, window=2) == 0.5 and trainer_wait_fraction(rows, window=1) == 0.5
    rows[-1]["wait_s"] = 0.0  # then the last step waited nothing: 1.5 over 4 s, and 0 over 1 s
    assert (trainer_wait_fraction(rows, window=2), trainer_wait_fraction(rows, window=1)) == (0.375, 0.0)
    assert trainer_wait_fraction(rows[:1]) is None


def test_lag_is_summed_per_group_and_the_largest_per_topic():
    status = NamespaceStatus({"n.tasks": 100, "n.experiences.raw": 40}, [
        LagReading("n.rollout", "n.tasks", 70, 100), LagReading("n-processors", "n.experiences.raw", 25, 40),
        LagReading("n-archive", "n.experiences.raw", 40, 40), LagReading("n-archive", "n.tasks", 90, 100)], 3)
    out = lag_report(status)
    assert {g: v["lag"] for g, v in out["groups"].items()} == {"n.rollout": 30, "n-processors": 15, "n-archive": 10}
    assert out["topic_lag"] == {"n.tasks": 30, "n.experiences.raw": 15} and out["policy_version"] == 3


def test_status_json_of_a_run_directory_gives_the_trainers_wait_fraction(tmp_path):
    import json

    from typer.testing import CliRunner

    from undertow.infra.cli import app

    run_dir = tmp_path / "demo-1"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("namespace: scaling-json\nmodel: {source: tiny}\n")
    (run_dir / "run.json").write_text(json.dumps({"stage": 0, "status": "done", "stages": []}))
    rows = [{"stage": "main", "component": "trainer", "step": i + 1, "time": t, "wait_s": w}
            for i, (t, w) in enumerate(((10, 0.5), (12, 1.0), (15, 1.5), (16, 0.5)))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = CliRunner().invoke(app, ["status", str(run_dir), "--json"], env={"UNDERTOW_BOOTSTRAP": ""})
    assert done.exit_code == 0, done.output
    signal = json.loads(done.stdout)
    # 3.0 s waited over the 6 s from the first step to the last (worked in the test above)
    assert signal["trainer_wait_fraction"] == 0.5 and signal["run"] == "demo-1" and signal["status"] == "done"
