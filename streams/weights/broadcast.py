"""The `broadcast` transport: a version's buckets over a gloo group, then the same files for the others.

Why a group per version: a torch.distributed group has a fixed size, and workers come and go. For
version v the trainer waits (a bounded time) for the workers it expects; each joiner takes the next
rank from an atomic counter on a TCPStore the trainer hosts and announces (`rendezvous`); the
trainer then fixes the size from that counter. A worker whose rank came too late is not in the
group and takes the version from the files announcement that follows. Every wait has a timeout,
and the trainer sends from a thread of its own: a worker that joins and dies costs that thread one
`timeout_s`, never training a step. torch is imported when a group is met, not with this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from undertow.kernel.disk import DiskFull
from undertow.kernel.models.weights import read_header
from undertow.schemas import MetricEvent, WeightIntegrityError, WeightUpdate, announce_buckets, verify_manifest
from undertow.streams.producer import RecordProducer

from .api import Lost, Published, Receiving, Sending, Settings, Transport, publish_weights, transports
from .files import Files, FilesSender
from .ready import Staged
from .staging import check_bucket, manifest_of, name_of, staging_directory

if TYPE_CHECKING:
    import torch.distributed as dist

log = logging.getLogger(__name__)

NAME = "broadcast"
METRICS_COMPONENT = "trainer-weights"


class BroadcastGroup(Settings):
    """`trainer.weights.broadcast`: the trainer's rendezvous and its timeouts."""

    host: str = Field("127.0.0.1", min_length=1, description="address the trainer's rendezvous binds and announces")
    port: int = Field(0, ge=0, le=65535, description="its port (0: any free one)")
    join_timeout_s: float = Field(5.0, gt=0, description="longest wait for the expected workers to join a version")
    timeout_s: float = Field(60.0, gt=0, description="longest wait on any peer while sending (a dead worker costs this)")


class BroadcastSettings(Settings):
    """`trainer.weights` fields the broadcast transport reads besides the files' ones."""

    broadcast: BroadcastGroup = Field(default_factory=BroadcastGroup, description="the broadcast group")


# The gloo group of one version, from both ends.

def host_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The trainer's rendezvous (port 0: any free one; `store.port` says which)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))


def connect(rendezvous: str, timeout_s: float) -> dist.TCPStore:
    """A worker's connection to the store at `host:port`."""
    import torch.distributed as dist

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
    import torch.distributed as dist

    return dist.ProcessGroupGloo(dist.PrefixStore(f"v{version}", store), rank, size, timedelta(seconds=timeout_s))


def send(pg: dist.ProcessGroup, buckets: list[bytes]) -> None:
    """Rank 0: every bucket's bytes, in order."""
    import torch

    with warnings.catch_warnings():  # a broadcast's root only reads its buffer
        warnings.simplefilter("ignore", UserWarning)
        for blob in buckets:
            if blob:
                pg.broadcast(torch.frombuffer(blob, dtype=torch.uint8), 0).wait()


def receive(pg: dist.ProcessGroup, sizes: list[int]) -> Iterator[memoryview]:
    """Other ranks: the buckets' bytes, one at a time (each valid until the next is asked for)."""
    import torch

    for size in sizes:
        buffer = torch.empty(size, dtype=torch.uint8)
        if size:
            pg.broadcast(buffer, 0).wait()
        yield memoryview(buffer.numpy())


def joined(store: dist.TCPStore, version: int) -> int:
    """How many workers tried to join version `version` so far, in time or late."""
    return store.add(f"v{version}/joined", 0)


# The trainer's end.

class BroadcastSender:
    """The buckets over a gloo group per version, from a thread; then files for the others."""

    def __init__(self, sending: Sending):
        self.s = sending
        self.producer = RecordProducer(sending.kafka)  # its own: the thread sends while the trainer does
        self.files = FilesSender(dataclasses.replace(sending, producer=self.producer))
        bc = sending.cfg.broadcast
        self.store = host_store(bc.host, bc.port, bc.timeout_s)
        self.rendezvous = f"{bc.host}:{self.store.port}"
        self.last: int | None = None  # the version broadcast before
        self.rounds: list[dict[str, Any]] = []  # what each version's broadcast did (tests, metrics)
        self._next: tuple[int, list[bytes]] | None = None
        self._cond = threading.Condition()
        self._closing = False
        self.failure: DiskFull | None = None  # a round's files met a full disk
        self._thread = threading.Thread(target=self._serve, name="weights-broadcast", daemon=True)
        self._thread.start()

    def pack(self, tensors: dict[str, Any], metadata: dict[str, str] | None) -> list[bytes]:
        return self.files.pack(tensors, metadata)

    def publish(self, version: int, packed: list[bytes]) -> Published:
        if self.failure is not None:
            raise self.failure
        with self._cond:  # a version not yet started is superseded by a newer one
            self._next = (version, packed)
            self._cond.notify_all()
        return Published(version, sum(len(b) for b in packed), 0, NAME)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        bc = self.s.cfg.broadcast
        self._thread.join(timeout=bc.join_timeout_s + bc.timeout_s + 600)
        self.producer.flush()
        self.producer.close()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._closing:
                    self._cond.wait()
                if self._next is None:
                    return
                (version, buckets), self._next = self._next, None
            try:
                self._round(version, buckets)
            except DiskFull as e:  # the trainer's next publish raises it: a full disk stops the trainer
                log.error("%s", e)
                self.failure = e
            except Exception:  # never lose the thread: the next version tries again
                log.exception("weights %s v%d: broadcast round failed", self.s.model, version)

    def _round(self, version: int, buckets: list[bytes]) -> None:
        s, bc = self.s, self.s.cfg.broadcast
        manifest = manifest_of(buckets)
        announcement = announce_buckets(s.model, version, manifest, transport=NAME, rendezvous=self.rendezvous,
                                        payload=s.payload, tokenizer=s.tokenizer)
        publish_weights(self.producer, s.topics.weights, [announcement])
        # Everyone who tried to join the last version, in time or late, is expected now; one that
        # died is not counted after the round it missed.
        expected = joined(self.store, self.last) if self.last is not None else 0
        started = time.perf_counter()
        size = close_membership(self.store, version, expected, bc.join_timeout_s)
        sent, error = False, None
        if size > 1:
            try:
                send(group(self.store, version, 0, size, bc.timeout_s), buckets)
                sent = True
            except Exception as e:  # a peer vanished or stalled: everyone falls back to the files below
                error = f"{type(e).__name__}: {e}"
                log.warning("weights %s v%d: broadcast to %d workers failed (%s); they take the files", s.model,
                            version, size - 1, error)
        self.last = version
        seconds = time.perf_counter() - started
        self.rounds.append({"version": version, "members": size - 1, "expected": expected, "sent": sent,
                            "error": error})
        self.producer.send(s.topics.metrics, MetricEvent(component=METRICS_COMPONENT, step=version, values={
            "broadcast_members": float(size - 1), "broadcast_expected": float(expected),
            "broadcast_sent": float(sent), "broadcast_s": seconds}), key=METRICS_COMPONENT)
        self.files.write(version, buckets, manifest)
        publish_weights(self.producer, s.topics.weights, [self.files.announcement(version, manifest)])


# The worker's end.

def receive_broadcast(update: WeightUpdate, store_timeout_s: float, staging_root: str | None = None) -> Staged | None:
    """Join the version's gloo group and stage the buckets it sends; None when the group had closed
    (the `files` announcement that follows brings the version). A vanished trainer raises
    WeightIntegrityError("broadcast") after the timeout."""
    assert update.manifest is not None and update.rendezvous is not None
    verify_manifest(update)
    try:
        with staging_directory(update, staging_root) as directory:
            files = _receive_into(directory, update, store_timeout_s)
    except _Late:
        return None
    return Staged(update.model, update.version, update.payload, files, directory, NAME)


def _receive_into(directory: Path, update: WeightUpdate, store_timeout_s: float) -> list[Path]:
    assert update.manifest is not None and update.rendezvous is not None
    try:
        store = connect(update.rendezvous, store_timeout_s)
        member = join(store, update.version, store_timeout_s)
        if member is None:
            raise _Late
        pg = group(store, update.version, *member, store_timeout_s)
        files = []
        for bucket, data in zip(update.manifest, receive(pg, [b.bytes for b in update.manifest])):
            target = directory / bucket.file
            target.write_bytes(data)
            check_bucket(update, bucket, len(data), hashlib.sha256(data).hexdigest(),
                         lambda: read_header(bytes(data[:_header_end(data)])))
            files.append(target)
        return files
    except (WeightIntegrityError, _Late):
        raise
    except Exception as e:  # torch.distributed's errors (timeouts, a closed peer) and the rest alike
        raise WeightIntegrityError(f"{name_of(update)}: broadcast from {update.rendezvous} failed "
                                   f"({type(e).__name__}: {e})", "broadcast") from None


class _Late(Exception):
    """Joined after the group closed: not an error, the files bring the version."""


def _header_end(data: memoryview) -> int:
    return 8 + int.from_bytes(bytes(data[:8]), "little") if len(data) >= 8 else len(data)


class BroadcastReceiver:
    """Joins the live groups of a worker that reads live; side consumers and catch-up wait for the files."""

    def __init__(self, receiving: Receiving):
        self.r = receiving

    def receive(self, update: WeightUpdate) -> Staged | None:
        if not self.r.join_groups or not self.r.caught_up.is_set():  # an old round: its group is gone
            return None
        return receive_broadcast(update, self.r.timeout_s, self.r.staging_dir)

    def lost(self) -> list[Lost]:
        return []


@transports.register(NAME)
class Broadcast(Transport):
    """The fastest path while the workers are up; files for late workers and side consumers."""

    needs = ("manifest", "rendezvous")
    may_carry = ("uri",)
    sender, receiver = BroadcastSender, BroadcastReceiver
    check_settings = Files.check_settings  # it writes the same files
