"""`trainer.weights`: the transport's name and the settings the built-in transports declare."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from undertow.kernel.registry import checked_entry

from .api import Settings, transport_of, transports
from .broadcast import BroadcastSettings
from .files import FilesSettings
from .kafka import InlineSettings


class _Choice(Settings):
    """Which transport: the first field of `trainer.weights`."""

    transport: str = Field(
        "kafka", description="a registered weights transport (streams/weights/) or a dotted path: kafka: inline "
                             "chunks on the topic (small models); files: buckets under `uri`; broadcast: buckets "
                             "over torch.distributed (gloo), then files for late workers")


class WeightsConfig(BroadcastSettings, FilesSettings, InlineSettings, _Choice):  # fields: the bases, last first
    """How policy versions reach the workers: the weights topic announces, a transport carries."""

    _check_transport = field_validator("transport")(lambda cls, v: checked_entry(transports, v))

    @model_validator(mode="after")
    def _the_transports_own_checks(self) -> "WeightsConfig":
        transport_of(self.transport).check_settings(self, self.transport)
        return self
