"""Secrets kept out of run directories: the config.yaml and stages/*.yaml a run writes hold a
`${ENV_VAR}` reference where the user's config had a Kafka password in clear.

A reference the user wrote (`sasl_password: ${KAFKA_PASSWORD}`) is kept as it is: every component
reads the variable when it validates its config (streams/settings.py), and `--resume` reads it
again. A password written in clear becomes `${UNDERTOW_KAFKA_SASL_PASSWORD}` (and so on), and its
value moves into the environment of `undertow run`, which the components it starts inherit; a
`--resume` in another shell needs that variable set, and its config check says so, naming it.
"""

from __future__ import annotations

import copy
from typing import Any

from undertow.streams.settings import SECRETS, env_reference

ENV_PREFIX = "UNDERTOW_KAFKA_"


def referenced(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """`raw` with each clear Kafka secret replaced by a `${UNDERTOW_KAFKA_<FIELD>}` reference, and
    the values it took out, by variable name."""
    kafka = raw.get("kafka")
    if not isinstance(kafka, dict):
        return raw, {}
    out, moved = copy.deepcopy(raw), {}
    for field in SECRETS:
        value = kafka.get(field)
        if value is None or env_reference(value) is not None:
            continue
        name = ENV_PREFIX + field.upper()
        moved[name] = str(value)
        out["kafka"][field] = f"${{{name}}}"
    return out, moved
