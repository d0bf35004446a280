"""Where undertow keeps local state, and how a command finds its Kafka cluster."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from infra.broker import LocalKafka
from kernel.config_io import ConfigError, load_config, load_yaml, validation_message  # noqa: F401 (re-exported)
from streams import NAMESPACE_PATTERN, KafkaSettings


class ClusterConfig(BaseModel):
    """The part of every config that says which cluster and which namespace to use."""

    model_config = ConfigDict(extra="ignore")  # the other sections belong to other commands

    namespace: str = Field("undertow", pattern=NAMESPACE_PATTERN, description="prefix of every topic name: <namespace>.tasks, …")
    kafka: KafkaSettings = Field(default_factory=KafkaSettings, description="how to reach the brokers")


def home() -> Path:
    """undertow's local state: $UNDERTOW_HOME, else ~/.undertow."""
    return Path(os.environ.get("UNDERTOW_HOME", Path.home() / ".undertow"))


def default_broker_dir() -> Path:
    return home() / "broker"


def load_cluster_config(path: str | Path | None) -> ClusterConfig:
    """The cluster section of a config file (defaults when no file)."""
    return ClusterConfig() if path is None else load_config(path, ClusterConfig)


def resolve_kafka(settings: KafkaSettings, broker_dir: Path | None = None) -> KafkaSettings:
    """Settings with bootstrap servers filled in: config, else $UNDERTOW_BOOTSTRAP, else the local broker
    (with its login and CA when the config names no security protocol)."""
    settings = settings.with_env()
    if settings.bootstrap_servers:
        return settings
    local = LocalKafka(broker_dir or default_broker_dir())
    if not local.running_nodes():
        raise ConfigError("kafka.bootstrap_servers: no cluster configured and no local broker running; "
                          "set UNDERTOW_BOOTSTRAP or run `undertow broker up`")
    if settings.security_protocol == "PLAINTEXT":  # the config says nothing of security: the broker's own
        return local.settings().model_copy(update={"client_id": settings.client_id})
    return settings.model_copy(update={"bootstrap_servers": local.bootstrap_servers})
