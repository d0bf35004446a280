"""Where undertow keeps local state, and how a command finds its Kafka cluster."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.broker import LocalKafka
from schemas.config_errors import validation_message
from streams import KafkaSettings


class ConfigError(ValueError):
    """A config file that does not validate; the message names the field and what was expected."""


class ClusterConfig(BaseModel):
    """The part of every config that says which cluster and which namespace to use."""

    model_config = ConfigDict(extra="ignore")  # the other sections belong to other commands

    namespace: str = Field("undertow", description="prefix of every topic name: <namespace>.tasks, …")
    kafka: KafkaSettings = Field(default_factory=KafkaSettings, description="how to reach the brokers")


def home() -> Path:
    """undertow's local state: $UNDERTOW_HOME, else ~/.undertow."""
    return Path(os.environ.get("UNDERTOW_HOME", Path.home() / ".undertow"))


def default_broker_dir() -> Path:
    return home() / "broker"


def load_yaml(path: str | Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read config: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_cluster_config(path: str | Path | None) -> ClusterConfig:
    """The cluster section of a config file (defaults when no file)."""
    if path is None:
        return ClusterConfig()
    try:
        return ClusterConfig.model_validate(load_yaml(path))
    except ValidationError as e:
        raise ConfigError(validation_message(str(path), e)) from None


def resolve_kafka(settings: KafkaSettings, broker_dir: Path | None = None) -> KafkaSettings:
    """Settings with bootstrap servers filled in: config, else $UNDERTOW_BOOTSTRAP, else the local broker."""
    settings = settings.with_env()
    if settings.bootstrap_servers:
        return settings
    local = LocalKafka(broker_dir or default_broker_dir())
    if not local.running_nodes():
        raise ConfigError("kafka.bootstrap_servers: no cluster configured and no local broker running; "
                          "set UNDERTOW_BOOTSTRAP or run `undertow broker up`")
    return settings.model_copy(update={"bootstrap_servers": local.bootstrap_servers})
