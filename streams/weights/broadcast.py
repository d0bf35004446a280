"""The `broadcast` transport: a version's buckets over a gloo group, then the same files for the others.

Why a group per version: a torch.distributed group has a fixed size, and workers come and go. For
version v the trainer waits (a bounded time) for the workers it expects; each joiner takes the next
attempt number from an atomic counter on a TCPStore the trainer hosts and announces (`rendezvous`),
and proves it holds the run's token (below); the trainer then fixes the group from the attempts
counted so far whose proof checks. A worker whose attempt came too late is not in the group and
takes the version from the files announcement that follows (the group and who may join it:
rendezvous.py). Every wait has a timeout, and the trainer sends from a thread of its own: a worker
that joins and dies costs that thread one `timeout_s`, never training a step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import Field

from undertow.kernel.disk import DiskFull
from undertow.kernel.models.weights import Blob, read_header, to_buckets
from undertow.schemas import Bucket, MetricEvent, WeightIntegrityError, WeightUpdate, announce_buckets, verify_manifest
from undertow.streams.producer import RecordProducer

from .api import Lost, Published, Receiving, Sending, Settings, Transport, publish_weights, transports
from .files import Files, FilesSender
from .ready import Staged
from .rendezvous import TOKEN_ENV, close_membership, connect, group, host_store, join, joined, proven, receive, run_token, send
from .staging import bucket_file, check_bucket, describe, file_buffer, in_memory, name_of, staging_directory

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


# The trainer's end.

@dataclasses.dataclass
class Packed:
    """A version's buckets (copies: training may go on) and their manifest entries, hashed on other
    threads while the trainer goes on."""

    buckets: list[Blob]
    entries: list[Future]

    def manifest(self) -> list[Bucket]:
        return [entry.result() for entry in self.entries]


class BroadcastSender:
    """The buckets over a gloo group per version, from a thread; then files for the others."""

    def __init__(self, sending: Sending):
        bc = sending.cfg.broadcast
        self.token = run_token()
        if not self.token and not _loopback(bc.host):
            raise ValueError(f"trainer.weights.broadcast.host ({bc.host}) is reachable from other machines: set "
                             f"{TOKEN_ENV} (the same secret) for the trainer and every worker, so that a stranger "
                             f"cannot join the group")
        self.s = sending
        self.producer = RecordProducer(sending.kafka)  # its own: the thread sends while the trainer does
        self.files = FilesSender(dataclasses.replace(sending, producer=self.producer))
        self.store = host_store(bc.host, bc.port, bc.timeout_s)
        self.rendezvous = f"{bc.host}:{self.store.port}"
        self.last: int | None = None  # the version broadcast before
        self.rounds: list[dict[str, Any]] = []  # what each version's broadcast did (tests, metrics)
        self._next: tuple[int, Packed] | None = None
        self._cond = threading.Condition()
        self._closing = False
        self.failure: DiskFull | None = None  # a round's files met a full disk
        self._hashing = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="weights-hash")
        # The files of a version are written behind its broadcast, at a lower CPU priority: where trainer
        # and workers share a machine, the workers' swap goes first.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="weights-files", initializer=_yield_cpu)
        self._writing: Future | None = None
        self._thread = threading.Thread(target=self._serve, name="weights-broadcast", daemon=True)
        self._thread.start()

    def pack(self, tensors: dict[str, Any], metadata: dict[str, str] | None) -> Packed:
        # Hashed once all are copied: copying and hashing at once on a machine's few cores took 0.44 s
        # for SmolLM2's 513 MiB, one after the other 0.36 s.
        buckets = to_buckets(tensors, self.files.bucket_bytes, metadata)
        return Packed(buckets, [self._hashing.submit(describe, bucket_file(i), blob) for i, blob in enumerate(buckets)])

    def publish(self, version: int, packed: Packed) -> Published:
        if self.failure is not None:
            raise self.failure
        with self._cond:  # a version not yet started is superseded by a newer one
            self._next = (version, packed)
            self._cond.notify_all()
        return Published(version, sum(len(b) for b in packed.buckets), 0, NAME)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        bc = self.s.cfg.broadcast
        self._thread.join(timeout=bc.join_timeout_s + bc.timeout_s + 600)
        self._writer.shutdown()
        self.producer.flush()
        self.producer.close()
        self._hashing.shutdown()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._closing:
                    self._cond.wait()
                if self._next is None:
                    return
                (version, packed), self._next = self._next, None
            try:
                self._round(version, packed)
            except DiskFull as e:  # the trainer's next publish raises it: a full disk stops the trainer
                log.error("%s", e)
                self.failure = e
            except Exception:  # never lose the thread: the next version tries again
                log.exception("weights %s v%d: broadcast round failed", self.s.model, version)

    def _round(self, version: int, packed: Packed) -> None:
        s, bc = self.s, self.s.cfg.broadcast
        buckets, manifest = packed.buckets, packed.manifest()
        if self._writing is not None:  # the files of the version before are announced before this one
            self._writing.result()
        announcement = announce_buckets(s.model, version, manifest, transport=NAME, rendezvous=self.rendezvous,
                                        payload=s.payload, tokenizer=s.tokenizer)
        publish_weights(self.producer, s.topics.weights, [announcement])
        # Everyone who proved the token for the last version, in time or late, is expected now; one
        # that died is not counted after the round it missed, and a stranger never is.
        expected = len(proven(self.store, self.last, self.token, joined(self.store, self.last))) \
            if self.last is not None else 0
        started = time.perf_counter()
        members = close_membership(self.store, version, self.token, expected, bc.join_timeout_s)
        size = members.size
        sent, error = False, None
        if size > 1:
            try:
                send(group(self.store, members.prefix, 0, size, bc.timeout_s), buckets)
                sent = True
            except Exception as e:  # a peer vanished or stalled: everyone falls back to the files below
                error = f"{type(e).__name__}: {e}"
                log.warning("weights %s v%d: broadcast to %d workers failed (%s); they take the files", s.model,
                            version, size - 1, error)
        self.last = version
        seconds = time.perf_counter() - started
        self.rounds.append({"version": version, "members": size - 1, "expected": expected, "sent": sent,
                            "error": error, "refused": members.refused})
        self.producer.send(s.topics.metrics, MetricEvent(component=METRICS_COMPONENT, step=version, values={
            "broadcast_members": float(size - 1), "broadcast_expected": float(expected),
            "broadcast_sent": float(sent), "broadcast_s": seconds}), key=METRICS_COMPONENT)
        self._writing = self._writer.submit(self._fallback, version, buckets, manifest)

    def _fallback(self, version: int, buckets: list[Blob], manifest: list[Bucket]) -> None:
        """The version's files and their announcement: for the workers that were late or are yet to
        start, and for side consumers. A full disk is the trainer's to raise (its next publish)."""
        try:
            self.files.write(version, buckets, manifest)
            publish_weights(self.producer, self.s.topics.weights, [self.files.announcement(version, manifest)])
        except DiskFull as e:
            log.error("%s", e)
            self.failure = e
        except Exception:
            log.exception("weights %s v%d: writing the files failed", self.s.model, version)


# The worker's end.

def receive_broadcast(update: WeightUpdate, store_timeout_s: float, staging_root: str | None = None,
                      token: str | None = None) -> Staged | None:
    """Join the version's gloo group with the run's token (default: $UNDERTOW_RUN_TOKEN) and stage the
    buckets it sends; None when the group had closed (the `files` announcement that follows brings the
    version). A vanished trainer, or one that refused the token, raises WeightIntegrityError("broadcast")."""
    assert update.manifest is not None and update.rendezvous is not None
    verify_manifest(update)
    try:
        with staging_directory(update, in_memory(update, staging_root)) as directory:
            files = _receive_into(directory, update, store_timeout_s, run_token() if token is None else token)
    except _Late:
        return None
    return Staged(update.model, update.version, update.payload, files, directory, NAME)


def _receive_into(directory: Path, update: WeightUpdate, store_timeout_s: float, token: str) -> list[Path]:
    assert update.manifest is not None and update.rendezvous is not None
    try:
        store = connect(update.rendezvous, store_timeout_s)
        member = join(store, update.version, store_timeout_s, token)
        if member is None:
            raise _Late
        rank, size, prefix = member
        pg = group(store, prefix, rank, size, store_timeout_s)
        buffers = (file_buffer(directory / bucket.file, bucket.bytes) for bucket in update.manifest)
        return _check_while_receiving(directory, update, receive(pg, buffers))
    except (WeightIntegrityError, _Late):
        raise
    except Exception as e:  # torch.distributed's errors (timeouts, a closed peer) and the rest alike
        raise WeightIntegrityError(f"{name_of(update)}: broadcast from {update.rendezvous} failed "
                                   f"({type(e).__name__}: {e})", "broadcast") from None


def _check_while_receiving(directory: Path, update: WeightUpdate, received: Iterator[memoryview]) -> list[Path]:
    """Check each bucket, received straight into its staged file, on a helper thread while the next
    one arrives: the sender is never held up by our hashing (sha256 releases the GIL). A bucket that
    fails its check fails the whole version: staging_directory removes the files."""
    assert update.manifest is not None
    files: list[Path] = []
    with ThreadPoolExecutor(1, thread_name_prefix="weights-check") as pool:
        pending: Future | None = None
        for bucket, data in zip(update.manifest, received):
            if pending is not None:
                files.append(pending.result())  # raises the previous bucket's WeightIntegrityError
            pending = pool.submit(_check, directory / bucket.file, update, bucket, data)
        if pending is not None:
            files.append(pending.result())
    return files


def _check(target: Path, update: WeightUpdate, bucket: Any, data: memoryview) -> Path:
    check_bucket(update, bucket, len(data), hashlib.sha256(data).hexdigest(),
                 lambda: read_header(bytes(data[:_header_end(data)])))
    return target


def _yield_cpu() -> None:
    """Lower the calling thread's CPU priority (Linux: niceness is per thread); elsewhere nothing."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (OSError, AttributeError):
        pass


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


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
