"""Weights over torch.distributed (gloo): one process group per policy version, between the trainer's
rank 0 and the workers that join it, met through a TCPStore the trainer hosts and announces.

Why a group per version: a torch.distributed group has a fixed size, and workers come and go. For
version v the trainer waits (a bounded time) for the workers it expects; each joiner takes the next
rank from an atomic counter; the trainer then fixes the size from that counter. A worker whose rank
came too late is not in the group and takes the version from files instead. Every wait has a timeout:
a worker that joins and dies costs the trainer's sending thread one timeout, never training.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist


def host_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The trainer's rendezvous (port 0: any free one; `store.port` says which)."""
    return dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))


def connect(rendezvous: str, timeout_s: float) -> dist.TCPStore:
    """A worker's connection to the store at `host:port`."""
    host, _, port = rendezvous.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))


def close_membership(store: dist.TCPStore, version: int, expected: int, join_timeout_s: float) -> int:
    """Trainer: wait until `expected` workers joined version `version` or the timeout passed, then fix
    and publish the group's size (the trainer and the workers counted so far)."""
    deadline = time.monotonic() + join_timeout_s
    while joined(store, version) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    size = joined(store, version) + 1  # counted atomically: anyone later gets a rank >= size
    store.set(f"v{version}/size", str(size))
    return size


def join(store: dist.TCPStore, version: int, timeout_s: float) -> tuple[int, int] | None:
    """Worker: (rank, size) in version `version`'s group, or None when it joined after the group closed."""
    rank = store.add(f"v{version}/joined", 1)
    store.wait([f"v{version}/size"], timedelta(seconds=timeout_s))
    size = int(store.get(f"v{version}/size"))
    return (rank, size) if rank < size else None


def group(store: dist.TCPStore, version: int, rank: int, size: int, timeout_s: float) -> dist.ProcessGroup:
    """The gloo group of version `version` (every member calls it; it waits for all of them)."""
    return dist.ProcessGroupGloo(dist.PrefixStore(f"v{version}", store), rank, size, timedelta(seconds=timeout_s))


def send(pg: dist.ProcessGroup, buckets: list[bytes]) -> None:
    """Rank 0: every bucket's bytes, in order."""
    with warnings.catch_warnings():  # a broadcast's root only reads its buffer
        warnings.simplefilter("ignore", UserWarning)
        for blob in buckets:
            if blob:
                pg.broadcast(torch.frombuffer(blob, dtype=torch.uint8), 0).wait()


def receive(pg: dist.ProcessGroup, sizes: list[int]) -> Iterator[memoryview]:
    """Other ranks: the buckets' bytes, one at a time (each valid until the next is asked for)."""
    for size in sizes:
        buffer = torch.empty(size, dtype=torch.uint8)
        if size:
            pg.broadcast(buffer, 0).wait()
        yield memoryview(buffer.numpy())


def joined(store: dist.TCPStore, version: int) -> int:
    """How many workers tried to join version `version` so far, in time or late."""
    return store.add(f"v{version}/joined", 0)
