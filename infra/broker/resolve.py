"""Where undertow keeps local state, and how a command finds its Kafka cluster."""

from __future__ import annotations

import os
from pathlib import Path

from undertow.infra.broker.local import LocalKafka
from undertow.kernel.config_io import ConfigError
from undertow.streams import KafkaSettings


def home() -> Path:
    """undertow's local state: $UNDERTOW_HOME, else ~/.undertow."""
    return Path(os.environ.get("UNDERTOW_HOME", Path.home() / ".undertow"))


def default_broker_dir() -> Path:
    return home() / "broker"


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
