"""`undertow run`: the whole loop on one machine, stage after stage, each component its own process.

Per stage: processors, trainer, rollout workers and feeder start as `undertow <stage> CONFIG`
children against one broker. The stage ends when the trainer reaches its steps. A child that
crashes is restarted after a backoff (`run.restarts`); one that crashes more often than the policy
allows ends the run as failed, with its log's tail. Ctrl-C stops feeder and workers first, then
the trainer (which checkpoints), then the processors. `--resume` continues an interrupted or a
failed run from the stage it stopped in: every component resumes from what it committed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from secrets import token_hex, token_urlsafe
from typing import Any, Callable

from undertow.infra.broker.local import LocalKafka, free_port_block
from undertow.infra.report.metrics_log import MetricsRecorder, RunEvents, last_recorded
from undertow.infra.run.restarts import Crash, RestartBudget
from undertow.infra.run.access import component_of, grant, login_references
from undertow.infra.run.secrets import referenced
from undertow.infra.run.rollout_env import engine_command
from undertow.infra.run.drain import Drain
from undertow.infra.run.config import RestartPolicy, RunConfig, RunStage, stage_config, stage_mapping, write_yaml
from undertow.infra.run.supervisor import ROLES, Child, Supervisor, role
from undertow.processors.config import processors_group
from undertow.rollout.config import rollout_group
from undertow.kernel.config_io import ConfigError
from undertow.streams import KafkaSettings, Topics, create_topics, grow_topics
from undertow.streams.settings import BOOTSTRAP_ENV, SECRETS, env_reference
from undertow.streams.weights.broadcast import TOKEN_ENV

# The trainer checkpoints before the processors go; the evaluator after the trainer, to score its final
# weights; the watchers after the evaluator, to read its last results; the monitor goes last, to write
# everyone's final metrics. A shadow's trainer and evaluator (`trainer@gspo`) stop with the run's.
STOP_ORDER = list(ROLES)


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
    """A stage's entry in run.json; a resumed stage adds its attempt's restarts to the earlier ones."""

    name: str
    status: str
    seconds: float
    message: str = ""
    restarts: dict[str, int] = field(default_factory=dict)  # restarts per component
    restart_policy: dict[str, float] = field(default_factory=dict)
    crashes: list[dict[str, Any]] = field(default_factory=list)  # each crash: when, cause, log line, backoff
    attempts: int = 1

    def after(self, earlier: dict[str, Any] | None) -> "StageOutcome":
        """This attempt's outcome, counting what earlier attempts of the stage recorded."""
        if earlier is None:
            return self
        restarts = dict(earlier.get("restarts", {}))
        for component, n in self.restarts.items():
            restarts[component] = restarts.get(component, 0) + n
        return StageOutcome(self.name, self.status, earlier.get("seconds", 0.0) + self.seconds, self.message,
                            restarts, self.restart_policy, earlier.get("crashes", []) + self.crashes,
                            earlier.get("attempts", 1) + 1)


class StageWatch:
    """One stage's crashes: counted against the restart policy, published, restarts scheduled."""

    def __init__(self, sup: Supervisor, policy: RestartPolicy, events: RunEvents, stage: str):
        self.sup, self.policy, self.events, self.stage = sup, policy, events, stage
        self.budget = RestartBudget(policy)
        self.crashes: list[Crash] = []
        events.publish("restart_policy", {f"restart_{k}": float(v) for k, v in policy.model_dump().items()})

    def crashed(self, child: Child) -> Crash:
        """Count a crash; schedule the restart (without waiting for it) if the policy allows one."""
        crash = self.budget.crashed(child.name, time.time(), child.returncode, child.tail(5))
        self.crashes.append(crash)
        allowed = crash.backoff_s is not None
        self.events.publish("restart" if allowed else "restart_refused",
                            {"exit_code": float(crash.exit_code), "crashes_in_window": float(crash.crashes_in_window),
                             "backoff_s": crash.backoff_s or 0.0, "restarts": float(child.restarts + allowed)},
                            child=child.name, cause=crash.cause, log_line=crash.log_line)
        if allowed:
            print(f"{self.stage}: {child.name} crashed ({crash.cause}; {crash.crashes_in_window} of "
                  f"{self.policy.max} allowed in {self.policy.window_s:g} s); restarting it in "
                  f"{crash.backoff_s:g} s", flush=True)
            self.sup.schedule_restart(child, crash.backoff_s)
        return crash

    def outcome(self, status: str, seconds: float, message: str) -> StageOutcome:
        restarts = {c.name: c.restarts for c in self.sup.children if c.restarts}
        return StageOutcome(self.stage, status, seconds, message, restarts, self.policy.model_dump(),
                            [c.as_dict() for c in self.crashes])


class Run:
    """One run directory: config.yaml, stages/*.yaml, logs/, checkpoints/, metrics.jsonl, run.json."""

    def __init__(self, config: RunConfig, raw: dict[str, Any], run_dir: Path,
                 view: Callable[["Run", str, MetricsRecorder], None] | None = None):
        # The stage configs written below keep references, never a secret; the values go to this
        # process's environment, which every component started inherits (infra/run/secrets.py).
        raw, secrets = referenced(raw)
        os.environ.update(secrets)
        # With a login per component, none of them gets the operator's (infra/run/access.py).
        self.operator_secrets = {*secrets, *filter(None, (env_reference((raw.get("kafka") or {}).get(f)) for f in SECRETS))}
        self.logins: dict[str, dict[str, str]] = {}  # component -> the environment of its login (access.per_component)
        # The broadcast rendezvous admits only peers that hold this (streams/weights/broadcast.py): the
        # caller's, else a fresh one per `undertow run`, given to the components it starts and never
        # written down (a resume restarts every component anyway).
        self.child_env = {TOKEN_ENV: os.environ.get(TOKEN_ENV) or token_hex(16)}
        self.config, self.raw, self.run_dir, self.view = config, raw, run_dir, view
        self.state = RunState.load(run_dir)
        self.stop_requested = threading.Event()
        self.broker: LocalKafka | None = None
        self.kafka: KafkaSettings | None = None

    def stages(self) -> list[RunStage | None]:
        return list(self.config.run.stages) or [None]

    def execute(self) -> list[StageOutcome]:
        """Run the remaining stages; stops at the first that does not finish."""
        self.kafka = self._cluster()
        if self.config.access.per_component:  # fresh passwords at every start: a resume rotates them
            self.logins = grant(self.kafka, self.config, self.raw,
                                issue=self.broker.issue if self.config.access.certificates else None)
        outcomes = []
        try:
            for index in range(self.state.stage, len(self.stages())):
                self.state.stage, self.state.status = index, "running"
                self.state.save(self.run_dir)  # a failed or interrupted run being resumed is running again
                outcome = self._run_stage(index, self.stages()[index])
                earlier = next((s for s in self.state.stages if s["name"] == outcome.name), None)
                outcome = outcome.after(earlier)
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

    def _run_stage(self, index: int, stage: RunStage | None) -> StageOutcome:
        name = stage.name if stage else "main"
        path, namespace, steps = self._stage_config(index, stage)
        topics = self.config.topics
        create_topics(self.kafka, namespace, topics.replication, topics.partitions)
        grow_topics(self.kafka, namespace, topics.partitions)  # a resume with more partitions adds them
        metrics = self.run_dir / "metrics.jsonl"
        recorder = MetricsRecorder(self.kafka, namespace, metrics, labels={"stage": name},
                                   after=last_recorded(metrics, stage=name))
        recorder.start()
        sup = Supervisor(self.run_dir / "logs" / f"{index}-{name}",
                         env={"UNDERTOW_BOOTSTRAP": self.kafka.bootstrap_servers, **self.child_env}, cpus=self.config.run.cpus,
                         hidden=self.operator_secrets if self.logins else ())
        start = lambda child, argv: sup.start(child, argv, env=self._login(child))  # noqa: E731
        events = RunEvents(self.kafka, namespace)
        watch = StageWatch(sup, self.config.run.restarts, events, name)
        cli = [sys.executable, "-m", "undertow.infra.cli"]
        started = time.time()
        start("processors", [*cli, "process", str(path), "--workers", str(self.config.run.processor_workers)])
        budget = ["--max-steps", str(steps)] if steps else []
        start("trainer", [*cli, "train", str(path), "--nproc", str(self.config.run.trainer_processes), *budget])
        merged = stage_config(self.raw, stage)
        for shadow in merged.shadows:  # the same steps on the same stream, one rank each
            create_topics(self.kafka, namespace, shadow=shadow.name)
            start(f"trainer@{shadow.name}", [*cli, "train", str(path), "--shadow", shadow.name, *budget])
        start("rollout", [*engine_command(merged.rollout), "rollout", str(path)])  # vllm: its own environment
        start("feeder", [*cli, "feed", str(path)])
        if self.config.run.archive:
            start("archive", [*cli, "archive", str(path)])
        if merged.eval.tasksets:  # a stage may switch the evaluation off or on
            start("eval", [*engine_command(merged.rollout), "eval", str(path)])
            for shadow in merged.shadows:
                start(f"eval@{shadow.name}", [*engine_command(merged.rollout), "eval", str(path), "--shadow", shadow.name])
        if self.config.watchers:
            start("watch", [*cli, "watch", str(path)])
        if self.config.monitor.sinks:
            start("monitor", [*cli, "monitor", str(path)])
        names = Topics(namespace)
        drain = Drain(self.kafka, [(names.tasks, rollout_group(namespace, merged.rollout.consumer_group)),
                                   (names.raw, processors_group(namespace, merged.processors.app_id))])
        try:
            status, message = self._watch(sup, watch, recorder, drain)
        finally:
            drain.stop()
            # The evaluator scores the final weights after its SIGTERM: on a real model that takes minutes.
            order = [name for r in STOP_ORDER for name in [r, *(f"{r}@{s.name}" for s in merged.shadows)]]
            sup.stop(order, timeouts={name: merged.eval.stop_timeout_s for name in order if role(name) == "eval"})
            recorder.stop()
            events.close()
        return watch.outcome(status, time.time() - started, message)

    def _watch(self, sup: Supervisor, watch: StageWatch, recorder: MetricsRecorder, drain: Drain) -> tuple[str, str]:
        """Wait for the trainers to finish, a child to crash too often, or a stop request.

        A crashed child is restarted after its backoff while the others are watched on: every
        component resumes from what it committed, so a crash costs time, not data. Once finite
        tasksets are all published, the stage ends when the rollout workers and the processors have
        committed all of them (`drain`) and the trainer has not stepped for run.idle_timeout_s since.
        """
        idle, policy = self.config.run.idle_timeout_s, self.config.run.restarts
        trainers = {c.name for c in sup.children if role(c.name) == "trainer"}
        finished: set[str] = set()
        while True:
            if self.stop_requested.is_set():
                return "interrupted", "stopped by the user"
            for child in sup.exited():
                if child.name in trainers and child.returncode == 0:
                    finished.add(child.name)
                    if finished == trainers:  # the run's trainer and every shadow's took their steps
                        return "done", ""
                    continue
                if child.name == "feeder" and child.returncode == 0:
                    drain.start()
                    if idle and idle_for(sup, child, recorder.last_time("trainer"), drain.settled_since) >= idle:
                        return "done", f"every task was used; the trainer had nothing left for {idle:g} s"
                    continue  # the tasksets ran out; workers finish what is queued
                if child.returncode == 0:
                    return "failed", f"{child.name} exited on its own; its log ({child.log}) ends:\n{child.tail()}"
                crash = watch.crashed(child)
                if crash.backoff_s is None:
                    return "failed", (f"{child.name} crashed {crash.crashes_in_window} times within "
                                      f"{policy.window_s:g} s (run.restarts.max is {policy.max}); last: {crash.cause}; "
                                      f"its log ({child.log}) ends:\n{child.tail()}")
            sup.restart_due()
            if self.view:
                self.view(self, watch.stage, recorder)
            time.sleep(self.config.run.refresh_s)

    def _stage_config(self, index: int, stage: RunStage | None) -> tuple[Path, str, int | None]:
        """Write the stage's effective config; returns its path, namespace and trainer steps."""
        mapping = stage_mapping(self.raw, stage)
        mapping.pop("run", None)
        mapping["kafka"] = {**(mapping.get("kafka") or {}), "bootstrap_servers": self.kafka.bootstrap_servers}
        if self.logins:  # each component reads its own login from its environment (`_login`)
            mapping["kafka"].update(login_references(self.kafka, self.config.access.certificates))
        mapping.setdefault("trainer", {})["checkpoint_dir"] = str(self.run_dir / "checkpoints")
        # A run's own broker restarts offsets at 0: its archive must not resume from another run's files.
        mapping["archive"] = {"root": str(self.run_dir / "archive"), **(mapping.get("archive") or {})}
        # The sinks write under the run directory, one TensorBoard / W&B / MLflow run per stage.
        mapping["monitor"] = {"dir": str(self.run_dir), "run": self.run_dir.name, **(mapping.get("monitor") or {}),
                              "stage": stage.name if stage else "main"}
        if index > 0 and not (stage and stage.model.get("init_from")):
            previous = stage_mapping(self.raw, self.stages()[index - 1])["namespace"]
            mapping.setdefault("model", {})["init_from"] = str(latest_export(self.run_dir / "checkpoints" / previous))
        path = write_yaml(self.run_dir / "stages" / f"{index}-{stage.name if stage else 'main'}.yaml", mapping)
        return path, mapping.get("namespace", "undertow"), stage.steps if stage else self.config.run.steps

    def _login(self, child: str) -> dict[str, str]:
        """The environment that logs `child` in as its component (none without access.per_component)."""
        return self.logins[component_of(child)] if self.logins else {}

    def _cluster(self) -> KafkaSettings:
        """The configured cluster, else a local broker whose data lives in the run directory (with
        access.per_component, one that authorizes by ACLs, the run logged in as its super user)."""
        settings = self.config.kafka.with_env()
        access = self.config.access
        if settings.bootstrap_servers:
            if access.certificates:
                raise ConfigError(f"access.login: certificate: the run issues certificates from its own broker's CA, "
                                  f"and the cluster at {settings.bootstrap_servers} (from ${BOOTSTRAP_ENV} or kafka:) "
                                  f"is not its own (unset {BOOTSTRAP_ENV} and kafka.bootstrap_servers; on Kubernetes, "
                                  f"Strimzi's User Operator issues them: `undertow acls --strimzi`)")
            if access.per_component and not settings.sasl:
                raise ConfigError(f"access.per_component: the cluster at {settings.bootstrap_servers} (from "
                                  f"${BOOTSTRAP_ENV} or kafka:) is reached with {settings.security_protocol}; each "
                                  f"component logs in with a password over SASL (or unset {BOOTSTRAP_ENV}: a broker "
                                  f"of the run's own is started)")
            return settings
        operator = {"operator": token_urlsafe(24)} if access.per_component and not access.certificates else None
        self.broker = LocalKafka(self.run_dir / "broker", port=free_port_block(2), sasl_users=operator,
                                 acls=access.per_component, client_certificates=access.certificates)
        self.broker.start()
        if access.per_component:
            return self.broker.settings().model_copy(update={"client_id": settings.client_id})
        return settings.model_copy(update={"bootstrap_servers": self.broker.bootstrap_servers})


def idle_for(sup: Supervisor, feeder: Child, last_step: float | None, settled_since: float | None) -> float:
    """Seconds the stage has had nothing left to do, once the feeder is done: since the trainer's last step,
    every worker's last (re)start and the moment the workers' lags last reached 0 (`settled_since`, None
    while they are not: infra/run/drain.py); 0 while a worker waits out its restart backoff. A rollout
    worker that crashed after a broker's outage still had tasks to do: the trainer's silence meanwhile
    ended a run with 10 tasks never generated."""
    others = [c for c in sup.children if c is not feeder]
    if settled_since is None or any(c.waiting for c in others):
        return 0.0
    return time.time() - max([last_step or feeder.started, settled_since, *(c.started for c in others)])


def latest_export(checkpoints: Path) -> Path:
    """The HF export of a stage's newest complete checkpoint (not a `.partial` save, nor one set aside)."""
    exports = sorted(p for p in checkpoints.glob("step-*/hf") if re.fullmatch(r"step-\d{8}", p.parent.name))
    if not exports:
        raise RuntimeError(f"{checkpoints}: the previous stage left no checkpoint to start from")
    return exports[-1]


def new_run_dir(config: RunConfig, raw: dict[str, Any], base: Path | None = None) -> Path:
    """A fresh run directory holding the config it was started with."""
    parent = base or Path(config.run.dir)
    run_dir = parent / f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=False)
    write_yaml(run_dir / "config.yaml", referenced(raw)[0])  # no secret in clear: `--resume` reads references
    return run_dir


def install_stop_handler(run: Run) -> None:
    """Ctrl-C / SIGTERM ask the run to stop in order; a second Ctrl-C is not needed."""
    def handle(signum: int, _frame: Any) -> None:
        run.stop_requested.set()
    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
