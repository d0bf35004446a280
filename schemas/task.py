"""Tasks (what rollout workers answer) and per-task pass-rate statistics (curriculum)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, JsonValue, ValidationInfo, field_validator

from .base import Id, Record, Text, UnixTime


class Task(Record):
    """One prompt to roll out `group_size` times; `prompt` text or chat `messages` (or both)."""

    kind: ClassVar[str] = "task"
    id_field: ClassVar[str | None] = "task_id"

    task_id: Id
    prompt: Text = ""
    # Chat form: [{"role": ..., "content": ...}]. Validated even when left out (prompt check).
    messages: list[dict[str, str]] = Field(default=[], validate_default=True)
    answer: Text | None = None  # reference answer for rewards; None when there is none
    taskset: Id = "default"
    group_size: Annotated[int, Field(ge=1)] = 1
    metadata: dict[str, JsonValue] = {}
    created_at: UnixTime

    @field_validator("messages")
    @classmethod
    def _chat_form(cls, messages: list[dict[str, str]], info: ValidationInfo) -> list[dict[str, str]]:
        for i, message in enumerate(messages):
            if "role" not in message or "content" not in message:
                raise ValueError(f"message {i} lacks 'role' or 'content'")
        # A task with neither form would make every worker generate from nothing.
        if not messages and info.data.get("prompt") == "":
            raise ValueError("empty, and prompt is empty too: give one of them")
        return messages


class TaskStat(Record):
    """Attempts and successes of one task so far; the feeder picks tasks by `pass_rate`."""

    kind: ClassVar[str] = "task_stat"
    id_field: ClassVar[str | None] = "task_id"

    task_id: Id
    taskset: Id = "default"
    attempts: Annotated[int, Field(ge=0)] = 0
    successes: Annotated[int, Field(ge=0)] = 0
    updated_at: UnixTime

    @field_validator("successes")
    @classmethod
    def _at_most_attempts(cls, successes: int, info: ValidationInfo) -> int:
        attempts = info.data.get("attempts")
        if attempts is not None and successes > attempts:
            raise ValueError(f"{successes} > attempts {attempts}")
        return successes

    @property
    def pass_rate(self) -> float:
        """successes / attempts; 0 before the first attempt."""
        return self.successes / self.attempts if self.attempts else 0.0
