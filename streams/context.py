"""What every component is handed beside its own config section: one run's namespace, its cluster
and its policy model, resolved once by the command that starts it (infra/), never read again."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from undertow.kernel.models.spec import ModelSpec
from undertow.streams.settings import KafkaSettings
from undertow.streams.topics import NAMESPACE_PATTERN, Topics


class RunContext(BaseModel):
    """The shared header of a run config, resolved: `kafka` has its bootstrap servers, and the local
    broker's TLS and login when the config named none. Picklable, so worker processes get it as is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field("undertow", pattern=NAMESPACE_PATTERN)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    model: ModelSpec = Field(default_factory=ModelSpec)
    shadow: str | None = Field(None, description="a shadow trainer's name: its own weights, refusals and evaluations")

    @property
    def topics(self) -> Topics:
        return Topics(self.namespace, self.shadow)
