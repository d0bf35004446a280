"""Weights transports: how a policy version's bytes travel from the trainer to the workers.

Every version is announced on `<ns>.weights`; a transport carries its bytes, each one module with its
settings, its sender (trainer side) and its receiver (worker side): `kafka` (inline chunks), `files`
(buckets under any fsspec URI), `broadcast` (a gloo group, then files). A new transport is one more
module: a `Transport` subclass registered in `transports` (api.py).
"""

from undertow.streams.weights.api import (
    Lost, Published, Receiver, Receiving, Sender, Sending, Settings, Transport, build_sender, check_announcement,
    publish_weights, transport_of, transports,
)
from undertow.streams.weights.broadcast import BroadcastSender, receive_broadcast
from undertow.streams.weights.config import WeightsConfig
from undertow.streams.weights.files import FilesSender, fetch_files
from undertow.streams.weights.kafka import KafkaSender, WeightAssembler
from undertow.streams.weights.ready import Assembled, Ready, Staged
from undertow.streams.weights.staging import manifest_of

__all__ = [
    "Assembled", "BroadcastSender", "FilesSender", "KafkaSender", "Lost", "Published", "Ready", "Receiver", "Receiving",
    "Sender", "Sending", "Settings", "Staged", "Transport", "WeightAssembler", "WeightsConfig", "build_sender",
    "check_announcement", "fetch_files", "manifest_of", "publish_weights", "receive_broadcast", "transport_of",
    "transports",
]
