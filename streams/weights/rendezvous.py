"""A version's gloo group, from both ends: the TCPStore the trainer hosts and announces, the
attempts workers take on it, the run token's proof that admits them, and the group itself with its
broadcast (streams/weights/broadcast.py is the transport built on it). Every wait has a timeout;
torch is imported when a group is met, not with this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from datetime import timedelta
from typing import TYPE_CHECKING

from undertow.kernel.models.weights import Blob

if TYPE_CHECKING:
    import torch.distributed as dist

log = logging.getLogger(__name__)


# The gloo group of one version, from both ends.

def host_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The trainer's rendezvous (port 0: any free one; `store.port` says which)."""
    import torch.distributed as dist

    store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    store.set("session", secrets.token_hex(16))  # what every proof of this store's joiners is bound to
    return store


def connect(rendezvous: str, timeout_s: float) -> dist.TCPStore:
    """A worker's connection to the store at `host:port`. A refused connection fails at once: the
    trainer hosts its store before it announces a version, so nobody listening means that trainer is
    gone, and TCPStore would retry it for twice `timeout_s` while the files could bring the version."""
    import torch.distributed as dist

    host, _, port = rendezvous.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s):
        pass
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))


# Who may join. The store itself has no authentication: anyone who reaches its port can read and
# write keys. So a joiner proves it holds the run's token (UNDERTOW_RUN_TOKEN, which `undertow run`
# gives every component it starts): beside its attempt number it writes HMAC(token, session/version/
# attempt), where the session is a nonce the trainer's store posts when it starts (so a proof seen
# once is worth nothing to another store, version or attempt); the trainer admits only the attempts
# whose proof checks, and the group forms under a key prefix derived from the token. A stranger is
# counted as an attempt, never admitted, never waited for; workers check every bucket against the
# manifest from Kafka anyway. What a token cannot stop is a peer on the network disturbing the store
# (it can list and write keys): bind `host` to a private interface.

TOKEN_ENV = "UNDERTOW_RUN_TOKEN"
PROOF_WAIT_S = 1.0  # how long the trainer waits for the proof of an attempt it counted


@dataclasses.dataclass(frozen=True)
class Membership:
    """A version's group as the trainer fixed it: its size (trainer included) and key prefix."""

    size: int
    prefix: str
    admitted: list[int]  # attempt numbers whose proof checked, in group-rank order
    refused: int  # attempts counted whose proof did not check (strangers, another run's workers)


def run_token() -> str:
    """The run's shared secret ('' when unset: any peer that reaches the store may join)."""
    return os.environ.get(TOKEN_ENV, "")


def _mac(store: dist.TCPStore, token: str, message: str) -> str:
    session = store.get("session").decode()
    return hmac.new(token.encode(), f"{session}/{message}".encode(), hashlib.sha256).hexdigest()


def attempt(store: dist.TCPStore, version: int, token: str) -> int:
    """Worker: take the next attempt number of version `version` and prove the token for it."""
    number = store.add(f"v{version}/joined", 1)
    store.set(f"v{version}/proof/{number}", _mac(store, token, f"v{version}/{number}"))
    return number


def proven(store: dist.TCPStore, version: int, token: str, attempts: int, wait_s: float = 0.0) -> list[int]:
    """The attempts 1..`attempts` whose proof checks (each waited for, at most `wait_s` in all)."""
    deadline = time.monotonic() + wait_s
    good = []
    for number in range(1, attempts + 1):
        key = f"v{version}/proof/{number}"
        while not store.check([key]) and time.monotonic() < deadline:
            time.sleep(0.01)
        if store.check([key]) and hmac.compare_digest(store.get(key).decode(),
                                                      _mac(store, token, f"v{version}/{number}")):
            good.append(number)
    return good


def close_membership(store: dist.TCPStore, version: int, token: str, expected: int,
                     join_timeout_s: float) -> Membership:
    """Trainer: wait until `expected` workers proved the token for version `version` or the timeout
    passed, then fix and publish the group (the trainer and the workers admitted so far)."""
    deadline = time.monotonic() + join_timeout_s
    while len(proven(store, version, token, joined(store, version))) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    counted = joined(store, version)  # counted atomically: anyone later has a higher attempt number
    admitted = proven(store, version, token, counted, PROOF_WAIT_S)
    store.set(f"v{version}/members", json.dumps({"counted": counted, "admitted": admitted}))
    if counted > len(admitted):
        log.warning("weights v%d: %d peer(s) joined without the run's token (%s): refused", version,
                    counted - len(admitted), TOKEN_ENV)
    return Membership(len(admitted) + 1, _prefix(store, version, token), admitted, counted - len(admitted))


def join(store: dist.TCPStore, version: int, timeout_s: float, token: str) -> tuple[int, int, str] | None:
    """Worker: (rank, size, key prefix) in version `version`'s group, or None when it joined after the
    group closed. Raises Refused when the trainer did not accept its proof (another token)."""
    number = attempt(store, version, token)
    store.wait([f"v{version}/members"], timedelta(seconds=timeout_s))
    members = json.loads(store.get(f"v{version}/members"))
    if number in members["admitted"]:
        return members["admitted"].index(number) + 1, len(members["admitted"]) + 1, _prefix(store, version, token)
    if number <= members["counted"]:
        raise Refused(f"the trainer refused this worker's proof for v{version}: {TOKEN_ENV} is not the run's")
    return None


class Refused(Exception):
    """The trainer did not admit this worker: its token is not the run's."""


def _prefix(store: dist.TCPStore, version: int, token: str) -> str:
    return f"v{version}/{_mac(store, token, f'v{version}/group')[:32]}"


def group(store: dist.TCPStore, prefix: str, rank: int, size: int, timeout_s: float) -> dist.ProcessGroup:
    """A version's gloo group under its key prefix (every member calls it; it waits for all of them).
    TimeoutError after `timeout_s` however gloo fares: with a worker SIGKILLed mid-round, gloo's own
    connect once outlasted its 60-s timeout five times over (`connectFullMesh failed ... Connect
    timeout` after 300 s) and held back the files every worker was waiting for. The abandoned attempt
    ends on gloo's clock, in a daemon thread that holds nothing the next round needs."""
    import torch.distributed as dist

    made: Future = Future()

    def connect() -> None:
        try:
            made.set_result(dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size,
                                                  timedelta(seconds=timeout_s)))
        except BaseException as e:  # handed to the caller, whatever it is
            made.set_exception(e)

    threading.Thread(target=connect, name=f"gloo-group-{prefix}", daemon=True).start()
    try:
        return made.result(timeout=timeout_s)
    except TimeoutError:
        raise TimeoutError(f"gloo group {prefix!r} (rank {rank} of {size}) not formed in {timeout_s:g} s") from None


def send(pg: dist.ProcessGroup, buckets: list[Blob]) -> None:
    """Rank 0: every bucket's bytes, in order."""
    import torch

    with warnings.catch_warnings():  # a broadcast's root only reads its buffer
        warnings.simplefilter("ignore", UserWarning)
        for blob in buckets:
            if blob:
                pg.broadcast(torch.frombuffer(blob, dtype=torch.uint8), 0).wait()


def receive(pg: dist.ProcessGroup, buffers: Iterable[memoryview]) -> Iterator[memoryview]:
    """Other ranks: the buckets' bytes, each into the writable buffer given for it, one at a time."""
    import torch

    for buffer in buffers:
        if len(buffer):
            pg.broadcast(torch.frombuffer(buffer, dtype=torch.uint8), 0).wait()
        yield buffer


def joined(store: dist.TCPStore, version: int) -> int:
    """How many workers tried to join version `version` so far, in time or late."""
    return store.add(f"v{version}/joined", 0)
