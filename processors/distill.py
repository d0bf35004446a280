"""`distill`: on-policy distillation. A teacher scores the student's own sampled tokens, and each
token's advantage is how much more the teacher likes it than the student did:

    A_t = coef · (log π_teacher(y_t | x, y_<t) − log π_student(y_t | x, y_<t))        [T]
        = −coef · (the per-token estimate of KL(π_student ‖ π_teacher), reverse KL, on y ~ π_student)

(Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from Self-Generated
Mistakes"; Thinking Machines' "On-Policy Distillation" 2025; Trinity-RFT's on_policy_distill.) The
student's log-probs are the records' behaviour log-probs; the teacher's are computed here, at the
sampling temperature, over the prompt and response tokens as they are, so the teacher must read the
student's tokenizer: a record stamped with another tokenizer's fingerprint is rejected. With
`mode: add` the distillation term is added to the advantage an earlier stage computed (reshape's
outcome advantage: reward and teacher together); `replace` makes it the whole advantage.
Observation tokens (loss_mask 0) get 0. The record keeps `teacher_kl`, its mean per-token estimate,
in metadata.

With `endpoint: {base_url, model}` the teacher is served by an OpenAI-compatible server (vLLM, SGLang)
instead of loaded here: one completions request per batch sends the records' token ids and reads
their log-probs back (`echo` with `logprobs`); `teacher:` then only names the model it serves, for
its tokenizer. A served model's log-probs are at its own temperature 1, so the rollout must sample at
1 too. A teacher past `timeout_s` rejects the batch's records (`teacher_timeout`), a failing one
`teacher_error`: they wait on the rejected topic, replayable, rather than train on nothing.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from undertow.kernel.models import ModelSpec, build_model, build_tokenizer, fingerprint
from undertow.kernel.models.checks import model_problems
from undertow.kernel.scoring.backends import OpenAIBackend
from undertow.kernel.lazy import torch
from undertow.processors.api import Reject, processor
from undertow.schemas import Experience
from undertow.schemas.logprobs import sequence_logprobs


@processor("distill")
class Distill:
    """teacher: a model spec (as `model:`; `init_from` for trained weights); endpoint: where it is
    served instead ({base_url, model, api_key_env, timeout_s}: kernel/scoring's OpenAIBackend); coef:
    the term's weight; mode: add (to the earlier stage's advantage) or replace; temperature: the
    rollout's sampling temperature; batch_size: sequences per teacher forward pass or request."""

    def __init__(self, *, teacher: Mapping[str, Any] | None, endpoint: Mapping[str, Any] | None = None,
                 coef: float = 1.0, mode: Literal["add", "replace"] = "replace", temperature: float = 1.0,
                 batch_size: int = 16):
        if teacher is None:
            raise ValueError("teacher: set the teacher model (a model spec, as `model:`; e.g. {source: hf, path: DIR})")
        if coef <= 0:
            raise ValueError(f"coef: expected > 0, got {coef}")
        if mode not in ("add", "replace"):
            raise ValueError(f"mode: expected add or replace, got {mode!r}")
        if temperature <= 0 or batch_size < 1:
            raise ValueError(f"temperature ({temperature}) must be > 0 and batch_size ({batch_size}) >= 1")
        self.spec = ModelSpec.model_validate(dict(teacher))
        self.endpoint = served_by(endpoint, temperature) if endpoint is not None else None
        if self.endpoint is None and (problems := list(model_problems(self.spec, "teacher"))):
            raise ValueError("; ".join(problems))  # at config check, not at the first batch
        self.coef, self.mode, self.temperature, self.batch_size = coef, mode, temperature, batch_size
        self.model: Any = None  # loaded at the first batch (with the tokenizer): checking a config builds no model
        self.tokenizer = ""
        self.runs_off_loop = True  # a teacher's forward pass takes seconds (streams/faust/worker.py)
        self.bounded = True  # undertow's own code: no stage deadline (pipeline.py)

    @staticmethod
    def reads_at_temperature(*, temperature: float = 1.0, **_: Any) -> float:
        """The sampling temperature its log-probs are compared at (a config rule holds it to the rollout's)."""
        return temperature

    def _load(self) -> None:
        if self.endpoint is not None:
            self.endpoint.load()
        else:
            self.model = build_model(self.spec).eval()
        self.tokenizer = fingerprint(build_tokenizer(self.spec))

    def process_batch(self, exps: list[Experience]) -> list[Experience | Reject]:
        if not self.tokenizer:
            self._load()
        out: list[Experience | Reject] = []
        for start in range(0, len(exps), self.batch_size):
            chunk = exps[start:start + self.batch_size]
            try:
                teacher = self.teacher_logprobs(chunk)
            except TimeoutError as e:
                out += [Reject("teacher_timeout", str(e))] * len(chunk)
                continue
            except Exception as e:  # noqa: BLE001 - an endpoint's failure is the batch's verdict, not the worker's end
                if self.endpoint is None:
                    raise
                out += [Reject("teacher_error", f"{type(e).__name__}: {e}")] * len(chunk)
                continue
            out += [self._distilled(e, t) for e, t in zip(chunk, teacher)]
        return out

    def teacher_logprobs(self, exps: list[Experience]) -> list[list[float]]:
        """log π_teacher of each record's response tokens: one forward pass, or one request, for the batch."""
        rows = [e.prompt_tokens + e.response_tokens for e in exps]
        if self.endpoint is not None:
            return self.endpoint.token_logprobs(rows, [len(e.prompt_tokens) for e in exps])
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
        with torch.no_grad():
            logp = sequence_logprobs(self.model, ids, mask, self.temperature).double()  # [B, W-1]
        # Column t predicts token t+1: response token j of record i sits at len(prompt) + j − 1.
        return [logp[i, len(e.prompt_tokens) - 1:len(e.prompt_tokens) - 1 + len(e.response_tokens)].tolist()
                for i, e in enumerate(exps)]

    def _distilled(self, exp: Experience, teacher: list[float]) -> Experience | Reject:
        stamp = exp.metadata.get("tokenizer")
        if stamp and stamp != self.tokenizer:
            return Reject("tokenizer_mismatch", f"the teacher reads tokenizer {self.tokenizer}, the record was made "
                                                f"with {stamp}: its token ids mean other words to the teacher")
        n = len(exp.response_tokens)
        if len(exp.behaviour_logprobs) != n:
            return Reject("no_logprobs", "distillation needs the student's behaviour log-probs of every response token")
        trained = exp.loss_mask or [1] * n
        gaps = [(t - s) if m else 0.0 for t, s, m in zip(teacher, exp.behaviour_logprobs, trained)]
        earlier = exp.advantages if self.mode == "add" and exp.advantages else [0.0] * n
        advantages = [a + self.coef * g for a, g in zip(earlier, gaps)]
        counted = max(sum(1 for m in trained if m), 1)
        kl = -sum(gaps) / counted  # mean of log π_student − log π_teacher over the trained tokens
        return exp.model_copy(update={"advantages": advantages, "metadata": {**exp.metadata, "teacher_kl": kl}})


def served_by(endpoint: Mapping[str, Any], temperature: float) -> OpenAIBackend:
    """The endpoint's client, refusing what it cannot do: log-probs at a temperature other than 1."""
    if temperature != 1.0:
        raise ValueError(f"temperature: an endpoint teacher gives its model's log-probs at temperature 1, the "
                         f"student's are at {temperature:g}: sample at 1, or load the teacher here (no endpoint)")
    fields = dict(endpoint)
    if not fields.get("base_url") or not fields.get("model"):
        raise ValueError(f"endpoint: needs base_url and model (got {sorted(fields)})")
    try:
        return OpenAIBackend(**fields)
    except TypeError as e:
        raise ValueError(f"endpoint: {e}") from None
