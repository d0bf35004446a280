"""Experiences (one sampled response with everything the trainer needs) and preference pairs."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, JsonValue, ValidationInfo, field_validator

from .base import Finite, Floats32, Id, LogProbs, Mask, Record, Text, TokenIds

NonEmptyTokenIds = Annotated[TokenIds, Field(min_length=1)]


class Experience(Record):
    """One response to one task, sample `sample_index` of a group of `group_size`.

    Per-token lists (`behaviour_logprobs`, `loss_mask`, `advantages`) are either empty, meaning
    not recorded / all ones / not computed, or exactly as long as `response_tokens`.
    """

    kind: ClassVar[str] = "experience"
    id_field: ClassVar[str | None] = "experience_id"

    experience_id: Id
    task_id: Id
    group_id: Id
    group_size: Annotated[int, Field(ge=1)] = 1
    sample_index: Annotated[int, Field(ge=0)] = 0
    prompt_text: Text = ""
    prompt_tokens: TokenIds
    response_text: Text = ""
    response_tokens: TokenIds
    behaviour_logprobs: LogProbs = []  # log-probs of response_tokens under the generating policy
    loss_mask: Mask = []  # 0 for tokens the policy did not produce (multi-turn observations)
    reward: Finite | None = None  # None: not scored yet
    reward_components: dict[str, Finite] = {}
    advantages: Floats32 = []
    policy_version: Annotated[int, Field(ge=0)]  # required: staleness control depends on it
    finish_reason: Literal["stop", "length", "abort"]  # required: "length" means truncated
    timestamps: dict[str, Finite] = {}  # stage name -> unix time the stage handled it
    priority: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    metadata: dict[str, JsonValue] = {}

    @field_validator("sample_index")
    @classmethod
    def _inside_group(cls, sample_index: int, info: ValidationInfo) -> int:
        group_size = info.data.get("group_size")
        if group_size is not None and sample_index >= group_size:
            raise ValueError(f"{sample_index} >= group_size {group_size}")
        return sample_index

    @field_validator("behaviour_logprobs", "loss_mask", "advantages")
    @classmethod
    def _one_per_response_token(cls, values: list, info: ValidationInfo) -> list:
        tokens = info.data.get("response_tokens")  # absent when it failed its own validation
        if values and tokens is not None and len(values) != len(tokens):
            raise ValueError(f"length {len(values)} != response_tokens length {len(tokens)}")
        return values

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_tokens)

    def mask(self) -> list[int]:
        """The effective loss mask: `loss_mask`, or all ones when it is empty."""
        return list(self.loss_mask) if self.loss_mask else [1] * len(self.response_tokens)


class PreferencePair(Record):
    """A chosen and a rejected response to one prompt (DPO-style training)."""

    kind: ClassVar[str] = "preference_pair"
    id_field: ClassVar[str | None] = "pair_id"

    pair_id: Id
    task_id: Id
    prompt_text: Text = ""
    prompt_tokens: TokenIds
    chosen_text: Text = ""
    chosen_tokens: NonEmptyTokenIds
    rejected_text: Text = ""
    rejected_tokens: NonEmptyTokenIds
    # Summed log-probs of each response under the reference model; None when not computed.
    chosen_ref_logprob: Finite | None = None
    rejected_ref_logprob: Finite | None = None
    policy_version: Annotated[int, Field(ge=0)] = 0
    metadata: dict[str, JsonValue] = {}
