"""A processor worker that stops serving one partition of experiences.raw until it is sought, the way
Faust lost deliveries around restarts (streams/faust/books.py): the delivery watch must find it.

    python -m tests.processors.lossy_worker CONFIG MODE PARTITION

MODE `dropped`: the partition's records are offered to Faust and then dropped (as Faust drops what
arrives behind its read position); `unfetched`: the consumer never offers them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from faust.transport.drivers.aiokafka import Consumer

import undertow.processors.runner as runner
import undertow.streams.faust.books as faust_books
import undertow.streams.faust.worker as faust_worker
from undertow.infra.cli.common import component


def losing(base: type[Consumer], partition: int) -> type[Consumer]:
    """`base`, losing `partition`'s records of the raw topic from the first one until a seek there."""

    class Losing(base):
        lost = 0  # records swallowed; a seek after the first one heals the partition
        healed = False

        async def seek(self, tp: Any, offset: int) -> None:
            if tp.partition == partition and self.lost:
                Losing.healed = True
                print(f"lossy worker: partition {partition} sought to {offset} after losing {self.lost}", flush=True)
            await super().seek(tp, offset)

        async def getmany(self, timeout: float):
            async for tp, message in super().getmany(timeout):
                if tp.partition == partition and tp.topic.endswith(".experiences.raw") and not Losing.healed:
                    Losing.lost += 1
                    continue
                yield tp, message

    return Losing


def main(config: str, mode: str, partition: int) -> None:
    if mode == "unfetched":  # below the booked consumer: it never sees the records
        faust_books.Consumer = losing(Consumer, partition)
    elif mode == "dropped":  # above it: offered, then gone
        booked = faust_worker.booked_consumer
        faust_worker.booked_consumer = lambda *args: losing(booked(*args), partition)
    else:
        raise SystemExit(f"unknown mode {mode}")
    cfg, context = component(Path(config))
    runner.run_worker(cfg.processors, context)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
