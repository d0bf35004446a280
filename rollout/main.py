"""Entry points: `run(config_path, kafka, ...)` for the rollout workers and `feed(config_path, kafka, ...)` for the feeder.

`undertow rollout` / `undertow feed` (infra/cli_rollout.py) and `undertow run` call these. Both stop
cleanly on SIGTERM / SIGINT: the current task finishes, experiences are flushed, offsets committed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from pathlib import Path

from streams import KafkaSettings

from rollout.config import FeedRunConfig, RolloutRunConfig, load_run_config

log = logging.getLogger(__name__)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return stop


def run(config_path: str | Path, kafka: KafkaSettings, *, workers: int | None = None, max_tasks: int | None = None,
        idle_timeout: float | None = None) -> int:
    """Run the rollout workers of a config against the resolved cluster `kafka`; returns the tasks
    done (summed over workers). The config's own `kafka:` section is not read again: `kafka` is what
    the command resolved (a local broker's TLS and login included).

    `workers` (default: rollout.workers) processes join one consumer group; `max_tasks` and
    `idle_timeout` apply to each worker.
    """
    config = load_run_config(config_path, RolloutRunConfig)
    count = workers or config.rollout.workers
    if count == 1:
        return _work(config, kafka, "rollout-0", max_tasks, idle_timeout).tasks
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each: no forked torch threads
    done = ctx.Queue()
    procs = [ctx.Process(target=_worker_process, name=f"rollout-{i}",
                         args=(str(config_path), kafka, i, max_tasks, idle_timeout, done)) for i in range(count)]
    for p in procs:
        p.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if threading.current_thread() is threading.main_thread():
            signal.signal(sig, lambda s, _: [os.kill(p.pid, signal.SIGTERM) for p in procs if p.is_alive()])
    for p in procs:
        p.join()
    failed = [p.name for p in procs if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"rollout workers {failed} failed")
    return sum(done.get() for _ in procs)


def _worker_process(config_path: str, kafka: KafkaSettings, index: int, max_tasks: int | None,
                    idle_timeout: float | None, done: multiprocessing.Queue) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rollout-{index} %(levelname)s %(message)s")
    config = load_run_config(config_path, RolloutRunConfig)
    done.put(_work(config, kafka, f"rollout-{index}", max_tasks, idle_timeout).tasks)


def _work(config: RolloutRunConfig, kafka: KafkaSettings, name: str, max_tasks: int | None,
          idle_timeout: float | None):
    import torch

    from rollout.worker import RolloutWorker

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    worker = RolloutWorker(config, kafka, name)
    stats = worker.run(max_tasks=max_tasks, idle_timeout=idle_timeout, stop=_stop_on_signals())
    log.info("%s: %s", name, stats)
    return stats


def feed(config_path: str | Path, kafka: KafkaSettings, *, max_tasks: int | None = None) -> int:
    """Run the task feeder of a config against the resolved cluster `kafka`; returns the tasks published."""
    from rollout.feed_runner import Feeder

    config = load_run_config(config_path, FeedRunConfig)
    feeder = Feeder(config, kafka)
    return feeder.run(max_tasks=max_tasks, stop=_stop_on_signals()).published
