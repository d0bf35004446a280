"""How to reach the Kafka cluster: one typed settings object shared by every client."""

from __future__ import annotations

import os
import re
import ssl
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BOOTSTRAP_ENV = "UNDERTOW_BOOTSTRAP"
SECRETS = ("sasl_password", "ssl_password")  # never written to a run directory in clear (infra/run/secrets.py)
_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def env_reference(value: object) -> str | None:
    """The variable's name when `value` is a `${NAME}` reference, else None."""
    match = _REFERENCE.match(value) if isinstance(value, str) else None
    return match.group(1) if match else None


class KafkaSettings(BaseModel):
    """Connection settings for kafka-python, aiokafka and Faust clients alike."""

    model_config = ConfigDict(extra="forbid")

    bootstrap_servers: str | None = Field(
        None, description="host:port[,host:port…]; None: $UNDERTOW_BOOTSTRAP, else the local broker")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka's security.protocol")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism when the protocol is SASL_* (None: PLAIN)")
    sasl_username: str | None = Field(None, description="SASL user name, or ${ENV_VAR}")
    sasl_password: str | None = Field(None, repr=False, description="SASL password, or ${ENV_VAR} to read it from "
                                                                    "the environment (what a run directory keeps)")
    ssl_cafile: str | None = Field(None, description="CA bundle that signed the brokers' certificates")
    ssl_certfile: str | None = Field(None, description="client certificate (mutual TLS), or ${ENV_VAR}")
    ssl_keyfile: str | None = Field(None, description="client private key (mutual TLS), or ${ENV_VAR}")
    ssl_password: str | None = Field(None, repr=False, description="password of an encrypted ssl_keyfile, or "
                                                                   "${ENV_VAR}")
    ssl_check_hostname: bool = Field(True, description="verify the broker's host name against its certificate")
    client_id: str = Field("undertow", description="client id reported to the brokers")
    outage_wait_s: float = Field(
        600.0, ge=0, description="how long a client waits, logging, for a cluster where no broker listens (a "
                                 "broker restarting) before it fails; records produced meanwhile wait as long")

    @field_validator(*SECRETS, "sasl_username", "ssl_certfile", "ssl_keyfile")
    @classmethod
    def _from_env(cls, v: str | None) -> str | None:
        """`${NAME}`: the value is the environment variable's (configs and run directories keep the name;
        `undertow run` gives each component its own login so)."""
        name = env_reference(v)
        if name is None:
            return v
        if name not in os.environ:
            raise ValueError(f"{v} is not set in the environment: set it (a run directory keeps the reference, "
                             f"never the secret)")
        return os.environ[name]

    @field_validator("bootstrap_servers")
    @classmethod
    def _hosts(cls, v: str | None) -> str | None:
        if v is None:
            return v
        hosts = [h.strip() for h in v.split(",") if h.strip()]
        bad = [h for h in hosts if ":" not in h or not h.rsplit(":", 1)[1].isdigit()]
        if not hosts or bad:
            raise ValueError(f"expected host:port[,host:port…], got {v!r}")
        return ",".join(hosts)

    @model_validator(mode="after")
    def _sasl_needs_a_sasl_protocol(self) -> "KafkaSettings":
        # kafka-python would ignore the mechanism and Faust would switch to SASL: refuse rather than split.
        if self.sasl_mechanism and not self.sasl:
            raise ValueError(f"sasl_mechanism: {self.sasl_mechanism} needs security_protocol SASL_PLAINTEXT or "
                             f"SASL_SSL, not {self.security_protocol}")
        return self

    def with_env(self) -> "KafkaSettings":
        """These settings, with bootstrap_servers taken from $UNDERTOW_BOOTSTRAP when unset."""
        if self.bootstrap_servers is None and os.environ.get(BOOTSTRAP_ENV):
            return self.model_copy(update={"bootstrap_servers": KafkaSettings(
                bootstrap_servers=os.environ[BOOTSTRAP_ENV]).bootstrap_servers})
        return self

    @property
    def hosts(self) -> list[str]:
        if self.bootstrap_servers is None:
            raise ValueError("bootstrap_servers: not set (config, $UNDERTOW_BOOTSTRAP, or `undertow broker up`)")
        return self.bootstrap_servers.split(",")

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def kafka_python(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python's KafkaProducer / KafkaConsumer / KafkaAdminClient."""
        kw: dict[str, Any] = {"bootstrap_servers": self.hosts, "client_id": self.client_id,
                              "security_protocol": self.security_protocol}
        if self.sasl:
            kw.update(sasl_mechanism=self.sasl_mechanism or "PLAIN", sasl_plain_username=self.sasl_username,
                      sasl_plain_password=self.sasl_password)
        if "SSL" in self.security_protocol:
            # The context Faust gets too: a file that cannot be read fails here, naming its setting,
            # where kafka-python would retry the handshake until its bootstrap timeout.
            # ssl_certfile is in the context already (kafka-python then ignores it): it says who the client is.
            kw.update(ssl_context=self.ssl_context(), ssl_check_hostname=self.ssl_check_hostname,
                      ssl_certfile=self.ssl_certfile)
        return kw

    def faust_broker(self) -> list[str]:
        """Faust's `broker` setting: one kafka:// URL per bootstrap host."""
        return [f"kafka://{h}" for h in self.hosts]

    def faust_credentials(self) -> Any:
        """Faust's `broker_credentials` (None for PLAINTEXT)."""
        import faust

        context = self.ssl_context()
        if self.sasl:
            return faust.SASLCredentials(username=self.sasl_username, password=self.sasl_password,
                                         mechanism=self.sasl_mechanism or "PLAIN", ssl_context=context)
        return faust.SSLCredentials(context) if context else None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context every client gets. A file that cannot be read is a ValueError naming the
        setting: ssl's own FileNotFoundError names no file, and escapes the CLI's one-line errors."""
        if "SSL" not in self.security_protocol:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ssl_cafile)
        except OSError as e:  # ssl.SSLError too: a file that holds no certificate
            raise ValueError(f"ssl_cafile: cannot load {self.ssl_cafile}: {e}") from None
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile:
            try:
                # A password of None with an encrypted key would prompt on the terminal: never from a worker.
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password=self.ssl_password or "")
            except OSError as e:
                raise ValueError(f"ssl_certfile / ssl_keyfile / ssl_password: cannot load {self.ssl_certfile} / "
                                 f"{self.ssl_keyfile}: {e}") from None
        return context
