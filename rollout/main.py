"""Entry points: `run(rollout, context, ...)` for the rollout workers and `feed(feeder, context, ...)` for the feeder.

`undertow rollout` / `undertow feed` (infra/cli/rollout.py) and `undertow run` call these. Both stop
cleanly on SIGTERM / SIGINT: the current task finishes, experiences are flushed, offsets committed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading

from undertow.streams import RunContext

from undertow.rollout.config import FeederConfig, RolloutConfig

log = logging.getLogger(__name__)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return stop


def run(cfg: RolloutConfig, context: RunContext, *, workers: int | None = None, max_tasks: int | None = None,
        idle_timeout: float | None = None) -> int:
    """Run the rollout workers of the `rollout:` section `cfg` in `context` (its cluster resolved by
    the command: a local broker's TLS and login included); returns the tasks done, summed over workers.

    `workers` (default: rollout.workers) processes join one consumer group; `max_tasks` and
    `idle_timeout` apply to each worker.
    """
    count = workers or cfg.workers
    if count == 1:
        return _work(cfg, context, "rollout-0", max_tasks, idle_timeout).tasks
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each: no forked torch threads
    done = ctx.Queue()
    procs = [ctx.Process(target=_worker_process, name=f"rollout-{i}",
                         args=(cfg, context, i, max_tasks, idle_timeout, done)) for i in range(count)]
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


def _worker_process(cfg: RolloutConfig, context: RunContext, index: int, max_tasks: int | None,
                    idle_timeout: float | None, done: multiprocessing.Queue) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rollout-{index} %(levelname)s %(message)s")
    done.put(_work(cfg, context, f"rollout-{index}", max_tasks, idle_timeout).tasks)


def _work(cfg: RolloutConfig, context: RunContext, name: str, max_tasks: int | None, idle_timeout: float | None):
    import torch

    from undertow.rollout.worker import RolloutWorker

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    worker = RolloutWorker(cfg, context, name)
    stats = worker.run(max_tasks=max_tasks, idle_timeout=idle_timeout, stop=_stop_on_signals())
    log.info("%s: %s", name, stats)
    return stats


def feed(cfg: FeederConfig, context: RunContext, *, max_tasks: int | None = None) -> int:
    """Run the task feeder of the `feeder:` section `cfg` in `context`; returns the tasks published."""
    from undertow.rollout.feed_runner import Feeder

    feeder = Feeder(cfg, context)
    return feeder.run(max_tasks=max_tasks, stop=_stop_on_signals()).published
