"""Who may call `undertow serve`: API keys, as OpenAI's clients send them (`Authorization: Bearer KEY`).

Whoever reaches the endpoint can publish experiences into training, so bound beyond loopback it
refuses to start without keys. The keys come from an environment variable or a file, never from the
config file (configs are committed, copied into run directories and printed). A request's key is
compared with every configured key in constant time, and no key is ever logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ApiKeys(BaseModel):
    """`serve.api_keys`: where the keys are, one of `env` (a variable holding keys separated by commas
    or newlines) or `file` (one key a line; blank lines and `#` comments skipped)."""

    model_config = ConfigDict(extra="forbid")

    env: str | None = Field(None, description="environment variable holding the keys (comma- or newline-separated)")
    file: str | None = Field(None, description="file holding one key a line")

    @model_validator(mode="after")
    def _one_place(self) -> "ApiKeys":
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env (a variable's name) or file (a path): keys never sit in the config")
        return self


def load_keys(where: ApiKeys) -> frozenset[str]:
    """The keys `where` points at; a missing variable or file, or one holding no key, is an error
    naming it (not an open endpoint)."""
    if where.env is not None:
        if where.env not in os.environ:
            raise ValueError(f"serve.api_keys.env: ${where.env} is not set")
        keys = {k.strip() for k in os.environ[where.env].replace("\n", ",").split(",")}
        source = f"${where.env}"
    else:
        path = Path(where.file).expanduser()
        if not path.is_file():
            raise ValueError(f"serve.api_keys.file: {path} is not a file")
        keys = {line.strip() for line in path.read_text().splitlines() if not line.strip().startswith("#")}
        source = str(path)
    keys.discard("")
    if not keys:
        raise ValueError(f"serve.api_keys: {source} holds no key")
    return frozenset(keys)


def is_loopback(host: str) -> bool:
    """Whether `host` (what uvicorn binds) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def check_binding(host: str, keys: frozenset[str]) -> None:
    """Refuse to serve beyond loopback without keys (anyone reaching it could train the model)."""
    if not keys and not is_loopback(host):
        raise ValueError(f"--host {host}: bound beyond loopback, the endpoint needs API keys "
                         f"(serve.api_keys: {{env: VARIABLE}} or {{file: PATH}})")


class KeyCheck:
    """Whether a request's Authorization header carries one of the keys."""

    def __init__(self, keys: frozenset[str]):
        self.keys = [k.encode() for k in keys]

    @property
    def required(self) -> bool:
        return bool(self.keys)

    def allows(self, authorization: str | None) -> bool:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        token = given.strip().encode()
        # Every key compared, each in constant time: the answer's timing says nothing of which or how much matched.
        matches = [hmac.compare_digest(token, key) for key in self.keys]
        return any(matches)
