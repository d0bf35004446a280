"""What a weights transport is: its two ends, what its announcements carry, and the registry of them.

A transport is one module (kafka.py, files.py, broadcast.py, or a user's): a `Transport` subclass
registered with `@transports.register(name)` that names its sender (trainer side: `pack`, then
`publish` a version) and its receiver (worker side: `receive` one update, return a version once
it is complete and verified). The trainer builds the configured transport's sender; a worker
builds, once, the receiver of each transport it sees announced.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from undertow.kernel.registry import Registry
from undertow.schemas import WeightIntegrityError, WeightUpdate

if TYPE_CHECKING:
    from undertow.streams.producer import RecordProducer
    from undertow.streams.settings import KafkaSettings
    from undertow.streams.topics import Topics
    from undertow.streams.weights.config import WeightsConfig
    from undertow.streams.weights.ready import Ready

# The WeightUpdate fields that say where a version's bytes are; which of them an announcement
# carries is its transport's to declare (`Transport.needs`, `Transport.may_carry`).
WHERE_FIELDS = ("data", "manifest", "uri", "rendezvous")


class Settings(BaseModel):
    """A transport's settings: fields of `trainer.weights`, declared in the transport's module."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class Published:
    """What one `publish` did: the version, its bytes, the records sent on the topic, by which transport."""

    version: int
    bytes: int
    records: int
    transport: str


class Sender(Protocol):
    def pack(self, tensors: dict[str, Any], metadata: dict[str, str] | None) -> Any:
        """What to keep of the gathered tensors (a copy: they may be freed or trained on afterwards)."""

    def publish(self, version: int, packed: Any) -> Published:
        """Announce `version` and send its bytes (or hand them to a thread of the sender's)."""

    def close(self) -> None:
        """Finish what was handed over, then release connections."""


@dataclass
class Sending:
    """What a sender is built with: whose versions, its settings, where to announce, the payload kind."""

    model: str
    cfg: WeightsConfig
    producer: RecordProducer | None
    topics: Topics | None
    payload: str = "full"  # "full" or "adapter"
    kafka: KafkaSettings | None = None  # for a sender that needs a producer of its own
    tokenizer: str | None = None  # the trainer's tokenizer fingerprint, announced with every version


@dataclass
class Lost:
    """A version a receiver gave up on (its chunks stopped coming); reported once the worker is live."""

    model: str
    version: int
    reason: str
    detail: str


class Receiver(Protocol):
    def receive(self, update: WeightUpdate) -> Ready | None:
        """The version `update` completes, verified; None while it is not complete. Raises
        WeightIntegrityError (its `reason` goes to the rejected topic) for one that is not sound."""

    def lost(self) -> list[Lost]:
        """Versions given up on since the last call."""


@dataclass
class Receiving:
    """What a receiver is built with, once per worker."""

    model: str
    staging_dir: str | None = None  # where versions are staged (None: the system's temporary directory);
    # broadcast stages in memory first (broadcast.in_memory)
    caught_up: threading.Event = field(default_factory=threading.Event)  # set once the worker reads live
    join_groups: bool = True  # join a live group (broadcast); False for side consumers such as the evaluator
    timeout_s: float = 60.0  # longest wait on a live peer


class Transport:
    """One way for a version's bytes to travel. Subclass it in one module and register it:

        @transports.register("mine")
        class Mine(Transport):
            needs = ("uri",)
            sender, receiver = MineSender, MineReceiver
    """

    needs: ClassVar[tuple[str, ...]] = ()  # WHERE_FIELDS its announcements must carry
    may_carry: ClassVar[tuple[str, ...]] = ()  # ... and may carry besides
    sender: ClassVar[type]  # built with a Sending, a Sender
    receiver: ClassVar[type]  # built with a Receiving, a Receiver

    @classmethod
    def check_settings(cls, cfg: WeightsConfig, name: str) -> None:
        """Raise ValueError, starting with the field's name, for settings this transport cannot work with."""


transports: Registry[type[Transport]] = Registry("weights transport")


def transport_of(name: str) -> type[Transport]:
    """The transport registered as `name`, or any Transport subclass by dotted path (what config accepts)."""
    found = transports.get(name)
    if not (isinstance(found, type) and issubclass(found, Transport)):
        raise ValueError(f"weights transport {name!r}: {found!r} is not a Transport")
    return found


def build_sender(sending: Sending) -> Sender:
    """The sender of the transport `sending.cfg.transport` names."""
    return transport_of(sending.cfg.transport).sender(sending)


def check_announcement(update: WeightUpdate, transport: type[Transport], name: str) -> None:
    """Raise WeightIntegrityError ("invalid") unless `update` carries what its transport's announcements
    need and nothing it does not take (the schema checks only what holds for every transport)."""
    for where in WHERE_FIELDS:
        present = getattr(update, where) is not None
        if where in transport.needs and not present:
            raise WeightIntegrityError(f"{update.model} v{update.version}: transport {name} needs {where}", "invalid")
        if present and where not in transport.needs + transport.may_carry:
            raise WeightIntegrityError(f"{update.model} v{update.version}: transport {name} takes no {where}",
                                       "invalid")


def publish_weights(producer: RecordProducer, topic: str, updates: list[WeightUpdate]) -> Published:
    """Send records of one version with their compaction keys, and wait for acks: an announcement is
    keyed by model (the compacted topic keeps the newest), an inline chunk by model and index."""
    for update in updates:
        key = update.model if update.data is None else f"{update.model}#{update.chunk_index}"
        producer.send(topic, update, key=key)
    producer.flush()
    first = updates[0]
    return Published(first.version, first.total_bytes, len(updates), first.transport)
