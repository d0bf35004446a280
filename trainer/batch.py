"""Experiences and preference pairs as padded tensors.

Sequences are prompt + response, right-padded to the batch's longest (rounded up to
`pad_to_multiple`). Per-token tensors are aligned with `schemas.logprobs.sequence_logprobs`: column t
holds the log-prob of token t+1, so response token j of a prompt of length P sits in column P-1+j.
"""

from __future__ import annotations

from dataclasses import dataclass

from undertow.kernel.lazy import torch

from undertow.schemas import Experience, PreferencePair


@dataclass
class SequenceBatch:
    """B sequences of at most T tokens; per-token tensors are [B, T-1]."""

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    mask: torch.Tensor  # [B, T-1] float: 1 on response tokens that are trained on
    behaviour_logp: torch.Tensor  # [B, T-1] float
    advantages: torch.Tensor  # [B, T-1] float
    policy_versions: torch.Tensor  # [B] long
    proximal_logp: torch.Tensor | None = None  # [B, T-1] under the weights before the step's first update
    returns: torch.Tensor | None = None  # [B, T-1] the critic's targets R_t (with a critic)
    old_values: torch.Tensor | None = None  # [B, T-1] the critic's V_t before the step's first update

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())


class ValuedExperience(Experience):
    """An experience with the critic's targets of this step (`returns`) and its values before the
    step's updates (`values`), one per response token: trainer-internal, built by the step's prepare
    pass, never put on a topic."""

    returns: list[float]
    values: list[float]

    @classmethod
    def of(cls, e: Experience, advantages: list[float], returns: list[float], values: list[float]) -> "ValuedExperience":
        fields = {**dict(e), "advantages": advantages, "returns": returns, "values": values}
        return cls.model_construct(_fields_set=set(fields), **fields)  # already valid: no second validation


@dataclass
class PairBatch:
    """P preference pairs as 2P sequences: rows [0, P) chosen, rows [P, 2P) rejected."""

    sequences: SequenceBatch
    ref_logp: torch.Tensor | None  # [2P] summed reference log-probs, None when not all given

    @property
    def pairs(self) -> int:
        return self.sequences.input_ids.shape[0] // 2


def _padded_length(lengths: list[int], multiple: int) -> int:
    longest = max(lengths)
    return -(-longest // multiple) * multiple


def pack_sequences(prompts: list[list[int]], responses: list[list[int]], *, pad_id: int,
                   pad_to_multiple: int = 8, masks: list[list[int]] | None = None,
                   behaviour: list[list[float]] | None = None, advantages: list[list[float]] | None = None,
                   versions: list[int] | None = None) -> SequenceBatch:
    """Right-pad prompt+response rows; lists left empty/None mean zeros (masks: all ones)."""
    n = len(prompts)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    width = _padded_length(lengths, pad_to_multiple)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    per_token = {k: torch.zeros((n, width - 1)) for k in ("mask", "behaviour", "advantages")}
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        ids[i, : lengths[i]] = torch.tensor(prompt + response, dtype=torch.long)
        attn[i, : lengths[i]] = 1
        cols = slice(len(prompt) - 1, lengths[i] - 1)  # predictions of the response tokens
        per_token["mask"][i, cols] = torch.tensor((masks[i] if masks and masks[i] else [1] * len(response)),
                                                  dtype=torch.float)
        for key, source in (("behaviour", behaviour), ("advantages", advantages)):
            if source and source[i]:
                per_token[key][i, cols] = torch.tensor(source[i], dtype=torch.float)
    return SequenceBatch(ids, attn, per_token["mask"], per_token["behaviour"], per_token["advantages"],
                         torch.tensor(versions or [0] * n, dtype=torch.long))


def collate_experiences(experiences: list[Experience], *, pad_id: int, pad_to_multiple: int = 8) -> SequenceBatch:
    if not experiences:
        raise ValueError("collate: no experiences")
    if any(not e.prompt_tokens for e in experiences):
        raise ValueError("collate: an experience without prompt tokens has no position to predict its first token")
    batch = pack_sequences([e.prompt_tokens for e in experiences], [e.response_tokens for e in experiences],
                           pad_id=pad_id, pad_to_multiple=pad_to_multiple, masks=[e.loss_mask for e in experiences],
                           behaviour=[e.behaviour_logprobs for e in experiences],
                           advantages=[e.advantages for e in experiences],
                           versions=[e.policy_version for e in experiences])
    if all(isinstance(e, ValuedExperience) for e in experiences):
        width = batch.mask.shape[1]
        batch.returns = response_columns([e.returns for e in experiences], experiences, width)
        batch.old_values = response_columns([e.values for e in experiences], experiences, width)
    return batch


def response_columns(rows: list[list[float]], experiences: list[Experience], width: int) -> torch.Tensor:
    """Per-response-token values into the batch's [B, width] columns (response token j of a prompt
    of length P in column P-1+j), zeros elsewhere."""
    out = torch.zeros((len(rows), width))
    for i, (row, e) in enumerate(zip(rows, experiences)):
        start = len(e.prompt_tokens) - 1
        out[i, start:start + len(row)] = torch.tensor(row, dtype=torch.float)
    return out


def collate_pairs(pairs: list[PreferencePair], *, pad_id: int, pad_to_multiple: int = 8) -> PairBatch:
    if not pairs:
        raise ValueError("collate: no preference pairs")
    prompts = [p.prompt_tokens for p in pairs] * 2
    responses = [p.chosen_tokens for p in pairs] + [p.rejected_tokens for p in pairs]
    sequences = pack_sequences(prompts, responses, pad_id=pad_id, pad_to_multiple=pad_to_multiple,
                               versions=[p.policy_version for p in pairs] * 2)
    refs = [p.chosen_ref_logprob for p in pairs] + [p.rejected_ref_logprob for p in pairs]
    ref = None if any(r is None for r in refs) else torch.tensor(refs, dtype=torch.float)
    return PairBatch(sequences, ref)
