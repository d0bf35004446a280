"""A user's watcher, as the README shows one, plus a word that makes it raise (the broker test's bug)."""

from __future__ import annotations

from undertow.schemas import Experience
from undertow.watchers import Alert, watcher


@watcher("fragile_too_long", reads=("raw",))
def too_long(exp: Experience, *, max_tokens: int = 512, raise_on: str | None = None) -> Alert | None:
    """Every response longer than `max_tokens` is an alert."""
    if raise_on is not None and exp.response_text == raise_on:
        raise RuntimeError(f"cannot judge {exp.experience_id}")
    if len(exp.response_tokens) > max_tokens:
        return Alert("too_long", "response_tokens", len(exp.response_tokens), max_tokens)
    return None
