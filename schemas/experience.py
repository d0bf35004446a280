"""Experiences (one sampled response with everything the trainer needs) and preference pairs."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, JsonValue, ValidationInfo, field_validator

from .base import MAX_TOKENS, Finite, Floats32, Id, LogProbs, Mask, Packed, Record, Text, TokenIds
from .versions import upgrader

NonEmptyTokenIds = Annotated[TokenIds, Field(min_length=1)]
Version = Annotated[int, Field(ge=0, le=2**31 - 1)]
Versions = Annotated[list[Version], Field(max_length=MAX_TOKENS), Packed("<i4")]


class Experience(Record):
    """One response to one task, sample `sample_index` of a group of `group_size`.

    Per-token lists (`behaviour_logprobs`, `loss_mask`, `advantages`, `token_versions`) are either
    empty, meaning not recorded / all ones / not computed / every token of `policy_version`, or
    exactly as long as `response_tokens`.

    Versions (schema v2): `token_versions[i]` is the policy version of the weights that sampled
    response token i; a sequence that spans an in-flight weight swap has several. `policy_version`
    is then the OLDEST of them (checked): staleness is a property of the stalest token, so the
    trainer's staleness rule and its rejected reason read `policy_version` alone. v1 records (one
    version per response) are upgraded with every token given the record's policy_version.
    """

    kind: ClassVar[str] = "experience"
    id_field: ClassVar[str | None] = "experience_id"
    schema_version: int = 2

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
    policy_version: Annotated[int, Field(ge=0)]  # required: staleness control depends on it; min(token_versions)
    token_versions: Versions = []  # policy version that sampled each response token (v2)
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

    @field_validator("token_versions")
    @classmethod
    def _oldest_is_the_policy_version(cls, versions: list[int], info: ValidationInfo) -> list[int]:
        tokens, version = info.data.get("response_tokens"), info.data.get("policy_version")
        if versions and tokens is not None and len(versions) != len(tokens):
            raise ValueError(f"length {len(versions)} != response_tokens length {len(tokens)}")
        if versions and version is not None and min(versions) != version:
            raise ValueError(f"oldest token version {min(versions)} != policy_version {version} "
                             f"(policy_version is the oldest token's)")
        return versions

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_tokens)

    def mask(self) -> list[int]:
        """The effective loss mask: `loss_mask`, or all ones when it is empty."""
        return list(self.loss_mask) if self.loss_mask else [1] * len(self.response_tokens)

    def versions(self) -> list[int]:
        """Each response token's policy version: `token_versions`, or policy_version for all when empty."""
        return list(self.token_versions) if self.token_versions else [self.policy_version] * len(self.response_tokens)


@upgrader("experience", 1)
def _one_version_per_token(fields: dict) -> dict:
    """v1 -> v2: a v1 response was sampled by one policy version, so every token had the record's."""
    n = len(fields.get("response_tokens") or [])
    return {**fields, "token_versions": [fields["policy_version"]] * n}


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
