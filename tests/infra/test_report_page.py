"""`undertow report`'s HTML page in a real headless browser (Debian's chromium, driven by playwright):
it loads with no console errors and no network, its panels hold the run's numbers, and the x-axis
switches between wall time and policy version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from undertow.infra.report.writer import write_report
from undertow.infra.report.series import smooth, smoothing_weight
from undertow.schemas import Experience, Rejected
from undertow.streams.archive_store import ArchivedMessage, ArchiveStore

CHROMIUM = Path("/usr/bin/chromium")  # infra/bootstrap.sh installs it; playwright never downloads one
T0 = 1_800_000_000.0
STEPS = 30


def metric_rows() -> list[dict]:
    """A two-stage run: 30 RL trainer steps a second apart, rollout and processor events between."""
    rows = [{"stage": "warmup", "component": "trainer", "step": 1, "version": 1.0, "time": T0, "loss": 2.0,
             "reward_mean": 0.0, "staleness_0": 8.0}]
    for s in range(1, STEPS + 1):
        t = T0 + 10 + s
        rows.append({"stage": "rl", "component": "trainer", "step": s, "version": float(s), "time": t,
                     "reward_mean": s / STEPS, "loss": 1.0 / s, "approx_kl": 0.001 * s, "ratio_mean": 1.0,
                     "clip_fraction": 0.01, "tokens_per_s": 100.0 + s, "wait_s": 0.5, "step_s": 0.1,
                     "staleness_0": 48.0, "staleness_1": 16.0 if s % 2 else 0.0, "rejected": 1.0 if s == 5 else 0.0,
                     "lr": 1e-3 * (1 - s / STEPS), "grad_norm": 2.0 + s})
        rows.append({"stage": "rl", "component": "rollout-0", "step": s, "policy_version": float(s - 1),
                     "time": t + 0.5, "reward_mean": 0.5, "tokens_per_s": 900.0})
    rows += [{"stage": "rl", "component": "eval", "step": v, "version": float(v), "time": T0 + 10 + v + 0.2,
              "sums-heldout/greedy_accuracy": v / 100, "sums-heldout/contamination": 0.0} for v in (0, 10, 20, 30)]
    # A watcher's alert half a second after the trainer reported version 15.
    rows.append({"stage": "rl", "component": "watcher", "step": 15, "time": T0 + 25.5, "watcher": "reward_hacking",
                 "alert": "reward_up_accuracy_down", "reward_slope": 0.02, "threshold": 0.0})
    # No version of their own: the page puts them at the trainer's version at their time (12 -> 12).
    rows += [{"stage": "rl", "component": "processors", "step": None, "worker": "w1", "time": T0 + 10 + v + 0.7,
              "clean.in": 64.0 * v, "clean.dropped": float(v // 10)} for v in (12, 24)]
    rows += [{"stage": "rl", "component": "feeder", "step": 64 * v, "time": T0 + 10 + v + 0.8, "sums/pass_rate": rate}
             for v, rate in ((10, 0.25), (20, 0.5))]
    return rows


def experience(i: int) -> Experience:
    return Experience(experience_id=f"sums/{i}@0/0", task_id=f"sums/{i}@0", group_id=f"sums/{i}@0",
                      prompt_text=f"{i}+1=", prompt_tokens=[1, 2], response_text=str(i + 1), response_tokens=[3, 4],
                      reward=1.0, advantages=[0.25, 0.75], policy_version=i, finish_reason="stop")


def make_run(tmp_path: Path, archive: bool) -> Path:
    run_dir = tmp_path / "demo-20260101-000000"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in metric_rows()))
    stages = [{"name": "warmup", "steps": 1}, {"name": "rl", "steps": STEPS}]  # namespaces demo-warmup, demo-rl
    (run_dir / "config.yaml").write_text(yaml.safe_dump(
        {"namespace": "demo", "run": {"name": "demo", "archive": archive, "stages": stages}}))
    (run_dir / "run.json").write_text(json.dumps({"status": "done", "stages": [
        {"name": "warmup", "status": "done", "seconds": 10.0}, {"name": "rl", "status": "done", "seconds": 31.0}]}))
    if archive:
        store = ArchiveStore(str(run_dir / "archive"), "demo-rl")
        ready = [ArchivedMessage(experience(i), 0, i, int((T0 + 11 + i) * 1000), None) for i in range(STEPS)]
        store.write_range("experiences.ready", "demo-rl.experiences.ready", 0, 0, STEPS - 1, ready)
        rejected = [Rejected.of("trainer", "stale", b"x", detail=f"version {i} is 3 behind", record_id=f"r{i}",
                                topic="demo-rl.experiences.ready").model_copy(update={"time": T0 + 10 + 2 * i})
                    for i in (4, 7, 9)]
        rejected.append(Rejected.of("clean", "truncated", b"y", detail="finish_reason length")
                        .model_copy(update={"time": T0 + 30}))
        store.write_range("experiences.rejected", "demo-rl.experiences.rejected", 0, 0, 3,
                          [ArchivedMessage(r, 0, i, int(r.time * 1000), None) for i, r in enumerate(rejected)])
    write_report(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `bash infra/bootstrap.sh` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield b
        b.close()


def open_page(browser, path: Path):
    """The page, its console errors, and any request that left the file (there must be none)."""
    page = browser.new_page()
    errors, outside = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
               else (outside.append(route.request.url), route.abort()))
    page.goto(path.as_uri())
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 8")
    return page, errors, outside


TRACES_JS = """key => Array.from(document.getElementById('panel-' + key).data).map(t => ({
    series: t.meta.series, kind: t.meta.kind, x: Array.from(t.x), y: Array.from(t.y), yaxis: t.yaxis || 'y',
    stackgroup: t.stackgroup || null, text: t.text ? Array.from(t.text) : null}))"""


def traces(page, key: str) -> dict[tuple[str, str], dict]:
    return {(t["series"], t["kind"]): t for t in page.evaluate(TRACES_JS, key)}


def test_the_page_shows_the_runs_numbers_and_switches_its_x_axis(tmp_path, browser):
    run_dir = make_run(tmp_path, archive=True)
    page, errors, outside = open_page(browser, run_dir / "report" / "index.html")
    assert errors == [] and outside == []
    rows = [r for r in metric_rows() if r["stage"] == "rl" and r["component"] == "trainer"]
    reward = traces(page, "reward")
    raw, smoothed = reward[("rl/trainer:reward_mean", "raw")], reward[("rl/trainer:reward_mean", "smoothed")]
    assert raw["y"] == pytest.approx([r["reward_mean"] for r in rows])
    assert raw["x"] == pytest.approx([r["time"] - T0 for r in rows])  # seconds since the first event
    assert smoothed["y"] == pytest.approx(smooth(raw["y"], smoothing_weight(STEPS)))
    heldout = traces(page, "heldout")[("rl/eval:sums-heldout/greedy_accuracy", "raw")]
    assert heldout["y"] == pytest.approx([0.0, 0.1, 0.2, 0.3])  # 4 points: drawn as they are
    stale = traces(page, "staleness")[("rl/trainer:staleness 1", "stacked")]  # 16 of 64, then none, smoothed
    assert stale["y"] == pytest.approx(smooth([0.25 if s % 2 else 0.0 for s in range(1, STEPS + 1)],
                                              smoothing_weight(STEPS)))
    assert traces(page, "rejections").keys() - {("alerts", "alert")} == {("rl/trainer:stale", "raw"),
                                                                         ("rl/clean:truncated", "raw")}
    assert traces(page, "rejections")[("rl/trainer:stale", "raw")]["y"] == [1, 2, 3]  # from the archive, cumulative
    assert traces(page, "curriculum")[("rl/feeder:sums/pass_rate", "raw")]["y"] == [0.25, 0.5]

    page.check("input[value=version]")
    page.wait_for_function("document.body.dataset.axis === 'version'")
    assert traces(page, "reward")[("rl/trainer:reward_mean", "raw")]["x"] == [float(s) for s in range(1, STEPS + 1)]
    assert traces(page, "reward")[("rl/rollout-0:reward_mean", "raw")]["x"] == [float(s) for s in range(STEPS)]
    assert traces(page, "throughput")[("rl/trainer:tokens_per_s", "smoothed")]["x"][-1] == STEPS
    # Rejected at 18, 24 and 28 s, when the trainer had just reported versions 8, 14 and 18.
    assert traces(page, "rejections")[("rl/trainer:stale", "raw")]["x"] == [8.0, 14.0, 18.0]
    assert traces(page, "rejections")[("rl/trainer:stale", "raw")]["y"] == [1, 2, 3]
    assert page.evaluate("document.getElementById('panel-reward').layout.xaxis.title.text") == "policy version (of its stage)"
    page.check("input[value=time]")
    page.wait_for_function("document.body.dataset.axis === 'time'")
    assert traces(page, "reward")[("rl/trainer:reward_mean", "raw")]["x"] == pytest.approx([r["time"] - T0 for r in rows])

    samples = page.evaluate("Array.from(document.querySelectorAll('#samples tbody tr')).map(r => r.innerText)")
    assert len(samples) == 24 and "\t0.5\t" in samples[0]  # advantage: the mean of 0.25 and 0.75
    reasons = page.evaluate("Array.from(document.querySelectorAll('#rejected-reasons tbody tr')).map(r => r.innerText)")
    assert reasons[0].startswith("demo-rl\ttrainer\tstale\t3") and "truncated" in reasons[1]
    assert errors == []


def test_without_an_archive_the_page_says_its_rejections_are_the_metrics(tmp_path, browser):
    run_dir = make_run(tmp_path, archive=False)
    page, errors, _ = open_page(browser, run_dir / "report" / "index.html")
    assert errors == []
    assert "no archive" in page.inner_text("#no-archive")
    dropped = traces(page, "rejections")[("rl/processors@w1:clean.dropped", "raw")]
    assert dropped["y"] == [1.0, 2.0]
    assert traces(page, "rejections")[("rl/trainer:rejected", "raw")]["y"][3:6] == [0.0, 1.0, 1.0]  # summed per step
    page.check("input[value=version]")
    page.wait_for_function("document.body.dataset.axis === 'version'")
    # The processors' events carry no version: they sit at the trainer's at their time.
    assert traces(page, "rejections")[("rl/processors@w1:clean.dropped", "raw")]["x"] == [12.0, 24.0]
    assert errors == []


def test_the_header_the_learning_rate_axis_the_stacked_staleness_and_the_alerts(tmp_path, browser):
    run_dir = make_run(tmp_path, archive=False)
    page, errors, outside = open_page(browser, run_dir / "report" / "index.html")
    assert errors == [] and outside == []
    notes = page.evaluate("Array.from(document.querySelectorAll('p.note')).map(p => p.innerText)")
    assert ("stage rl: model tiny; rl (ppo_clip, token_mean), advantage grpo; batch 8, max staleness 4; engine "
            "transformers; weights by kafka; eval sums-heldout: held out (no training prompt)") in notes, notes
    assert any(n.startswith("stage warmup: model tiny;") for n in notes)
    # The learning rate (1e-3) on an axis of its own: beside a gradient norm of 32 it would read as 0.
    optimizer = traces(page, "optimizer")
    assert optimizer[("rl/trainer:lr", "smoothed")]["yaxis"] == "y2"
    assert optimizer[("rl/trainer:grad_norm", "smoothed")]["yaxis"] == "y"
    right = page.evaluate("(() => { const l = document.getElementById('panel-optimizer')._fullLayout;"
                          " return {title: l.yaxis2.title.text, top: l.yaxis2.range[1], left: l.yaxis.range[1]}; })()")
    assert right["title"] == "learning rate" and 1e-3 <= right["top"] < 2e-3 and right["left"] > 30
    # Staleness shares as stacked areas, with no raw band over them.
    stale = traces(page, "staleness")
    assert {kind for _, kind in stale} == {"stacked", "alert"} and all(
        t["stackgroup"] == "shares" for (_, kind), t in stale.items() if kind == "stacked")
    # The alert on every panel, at its time and, on the version axis, at version 15.
    for key in ("reward", "optimizer", "staleness", "heldout"):
        alert = traces(page, key)[("alerts", "alert")]
        assert alert["x"] == [25.5] and alert["text"] == ["reward_hacking: reward_up_accuracy_down"], key
    page.check("input[value=version]")
    page.wait_for_function("document.body.dataset.axis === 'version'")
    assert traces(page, "reward")[("alerts", "alert")]["x"] == [15.0]
    assert errors == []
