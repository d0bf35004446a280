"""`undertow run`: the whole loop on one machine, stage after stage, each component its own process.

Per stage: processors, trainer, rollout workers and feeder start as `undertow <stage> CONFIG`
children against one broker. The stage ends when the trainer reaches its steps; a child that dies
before that ends the run with its log's tail. Ctrl-C stops feeder and workers first, then the
trainer (which checkpoints), then the processors, so that `--resume` continues where it stopped.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from infra.broker import LocalKafka, free_port_block
from infra.metrics_log import MetricsRecorder
from infra.run_config import RunConfig, Stage, stage_mapping, write_yaml
from infra.supervisor import Supervisor
from streams import KafkaSettings, create_topics

STOP_ORDER = ["feeder", "rollout", "trainer", "processors", "archive"]  # the trainer checkpoints before processors go


@dataclass
class RunState:
    """run.json: where a run is, so that `--resume` knows which stage to continue."""

    stage: int = 0
    status: str = "running"  # running | done | interrupted | failed
    stages: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir: Path) -> "RunState":
        path = run_dir / "run.json"
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def save(self, run_dir: Path) -> None:
        (run_dir / "run.json").write_text(json.dumps(asdict(self), indent=2))


@dataclass
class StageOutcome:
    name: str
    status: str
    seconds: float
    message: str = ""
    restarts: dict[str, int] = field(default_factory=dict)


class Run:
    """One run directory: config.yaml, stages/*.yaml, logs/, checkpoints/, metrics.jsonl, run.json."""

    def __init__(self, config: RunConfig, raw: dict[str, Any], run_dir: Path,
                 view: Callable[["Run", str, MetricsRecorder], None] | None = None):
        self.config, self.raw, self.run_dir, self.view = config, raw, run_dir, view
        self.state = RunState.load(run_dir)
        self.stop_requested = threading.Event()
        self.broker: LocalKafka | None = None
        self.kafka: KafkaSettings | None = None

    def stages(self) -> list[Stage | None]:
        return list(self.config.run.stages) or [None]

    def execute(self) -> list[StageOutcome]:
        """Run the remaining stages; stops at the first that does not finish."""
        self.kafka = self._cluster()
        outcomes = []
        try:
            for index in range(self.state.stage, len(self.stages())):
                self.state.stage = index
                outcome = self._run_stage(index, self.stages()[index])
                outcomes.append(outcome)
                self.state.stages = [s for s in self.state.stages if s["name"] != outcome.name] + [asdict(outcome)]
                if outcome.status != "done":
                    self.state.status = outcome.status
                    break
            else:
                self.state.stage, self.state.status = len(self.stages()), "done"
        finally:
            self.state.save(self.run_dir)
            if self.broker:
                self.broker.stop()
        return outcomes

    # -- one stage ---------------------------------------------------------------------------

    def _run_stage(self, index: int, stage: Stage | None) -> StageOutcome:
        name = stage.name if stage else "main"
        path, namespace, steps = self._stage_config(index, stage)
        create_topics(self.kafka, namespace)
        recorder = MetricsRecorder(self.kafka, namespace, self.run_dir / "metrics.jsonl", labels={"stage": name})
        recorder.start()
        sup = Supervisor(self.run_dir / "logs" / f"{index}-{name}",
                         env={"UNDERTOW_BOOTSTRAP": self.kafka.bootstrap_servers})
        cli = [sys.executable, "-m", "infra.cli"]
        started = time.time()
        sup.start("processors", [*cli, "process", str(path), "--workers", str(self.config.run.processor_workers)])
        sup.start("trainer", [*cli, "train", str(path), *(["--max-steps", str(steps)] if steps else [])])
        sup.start("rollout", [*cli, "rollout", str(path)])
        sup.start("feeder", [*cli, "feed", str(path)])
        if self.config.run.archive:
            sup.start("archive", [*cli, "archive", str(path)])
        try:
            status, message = self._watch(sup, name, recorder)
        finally:
            sup.stop(STOP_ORDER)
            recorder.stop()
        restarts = {c.name: c.restarts for c in sup.children if c.restarts}
        return StageOutcome(name, status, time.time() - started, message, restarts)

    def _watch(self, sup: Supervisor, name: str, recorder: MetricsRecorder) -> tuple[str, str]:
        """Wait for the trainer to finish, a child to die for good, or a stop request.

        A child that crashes is restarted (up to run.restarts times each): every component resumes
        from what it committed, so a crash costs time, not data. Once finite tasksets are all
        published, the stage ends when the trainer has not stepped for run.idle_timeout_s.
        """
        idle = self.config.run.idle_timeout_s
        while True:
            if self.stop_requested.is_set():
                return "interrupted", "stopped by the user"
            for child in sup.exited():
                if child.name == "trainer" and child.returncode == 0:
                    return "done", ""
                if child.name == "feeder" and child.returncode == 0:
                    if idle and time.time() - (recorder.last_time("trainer") or child.started) >= idle:
                        return "done", f"every task was used; the trainer had nothing left for {idle:g} s"
                    continue  # the tasksets ran out; workers finish what is queued
                if child.returncode != 0 and child.restarts < self.config.run.restarts:
                    print(f"{name}: {child.name} exited with code {child.returncode}; restarting it "
                          f"({child.restarts + 1}/{self.config.run.restarts})", flush=True)
                    sup.restart(child)
                    continue
                return "failed", (f"{child.name} exited with code {child.returncode}; "
                                  f"its log ({child.log}) ends:\n{child.tail()}")
            if self.view:
                self.view(self, name, recorder)
            time.sleep(self.config.run.refresh_s)

    def _stage_config(self, index: int, stage: Stage | None) -> tuple[Path, str, int | None]:
        """Write the stage's effective config; returns its path, namespace and trainer steps."""
        mapping = stage_mapping(self.raw, stage)
        mapping.pop("run", None)
        mapping["kafka"] = {**(mapping.get("kafka") or {}), "bootstrap_servers": self.kafka.bootstrap_servers}
        mapping.setdefault("trainer", {})["checkpoint_dir"] = str(self.run_dir / "checkpoints")
        # A run's own broker restarts offsets at 0: its archive must not resume from another run's files.
        mapping["archive"] = {"root": str(self.run_dir / "archive"), **(mapping.get("archive") or {})}
        if index > 0 and not (stage and stage.model.get("init_from")):
            previous = stage_mapping(self.raw, self.stages()[index - 1])["namespace"]
            mapping.setdefault("model", {})["init_from"] = str(latest_export(self.run_dir / "checkpoints" / previous))
        path = write_yaml(self.run_dir / "stages" / f"{index}-{stage.name if stage else 'main'}.yaml", mapping)
        return path, mapping.get("namespace", "undertow"), stage.steps if stage else self.config.run.steps

    def _cluster(self) -> KafkaSettings:
        """The configured cluster, else a local broker whose data lives in the run directory."""
        settings = self.config.kafka.with_env()
        if settings.bootstrap_servers:
            return settings
        self.broker = LocalKafka(self.run_dir / "broker", port=free_port_block(2))
        self.broker.start()
        return settings.model_copy(update={"bootstrap_servers": self.broker.bootstrap_servers})


def latest_export(checkpoints: Path) -> Path:
    """The HF export of a stage's newest checkpoint."""
    exports = sorted(checkpoints.glob("step-*/hf"))
    if not exports:
        raise RuntimeError(f"{checkpoints}: the previous stage left no checkpoint to start from")
    return exports[-1]


def new_run_dir(config: RunConfig, raw: dict[str, Any], base: Path | None = None) -> Path:
    """A fresh run directory holding the config it was started with."""
    parent = base or Path(config.run.dir)
    run_dir = parent / f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=False)
    write_yaml(run_dir / "config.yaml", raw)
    return run_dir


def install_stop_handler(run: Run) -> None:
    """Ctrl-C / SIGTERM ask the run to stop in order; a second Ctrl-C is not needed."""
    def handle(signum: int, _frame: Any) -> None:
        run.stop_requested.set()
    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
