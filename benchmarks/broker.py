"""The cluster a benchmark measures against: $UNDERTOW_BOOTSTRAP's, else a LocalKafka of its own."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from undertow.infra.broker.local import LocalKafka, free_port_block
from undertow.streams import KafkaSettings


@contextmanager
def benchmark_cluster(directory: Path) -> Iterator[KafkaSettings]:
    """Settings for the named cluster, or for a broker started under `directory` (stopped on exit)."""
    if os.environ.get("UNDERTOW_BOOTSTRAP"):
        yield KafkaSettings().with_env()
        return
    broker = LocalKafka(directory / "kafka", port=free_port_block(2)).start()
    try:
        yield KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
    finally:
        broker.stop()
