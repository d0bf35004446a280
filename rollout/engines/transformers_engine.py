"""The transformers engine: batched `generate()` on CPU or GPU, log-probs recomputed the trainer's way."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Mapping

from undertow.kernel.lazy import torch  # a process that only checks a config naming this engine never imports it
from undertow.kernel.models import ModelSpec, build_model, build_tokenizer, load_weights
from undertow.kernel.models.weights import load_weight_files
from undertow.kernel.models.adapters import apply_adapter, is_adapter
from undertow.schemas.logprobs import sequence_logprobs

from undertow.rollout.engines.base import Sample, SamplingParams, engines


@engines.register("transformers")
class TransformersEngine:
    """A Hugging Face causal LM built from a ModelSpec (tiny, HF directory or GGUF).

    Behaviour log-probs come from a separate scoring pass through `schemas.logprobs.sequence_logprobs`
    over prompt + response, the very function the trainer calls, rather than from generate()'s scores
    (which top-p has already warped): with the same weights the two agree to float rounding.
    """

    environment: ClassVar[str] = "main"

    @classmethod
    def check_sampling(cls, params: SamplingParams) -> None:
        pass  # its log-probs are recomputed over the whole vocabulary, whatever top-p sampled

    @classmethod
    def adapter_problem(cls, options: Mapping[str, Any], rank: int) -> str | None:
        return None  # peft applies an adapter of any rank

    def __init__(self, spec: ModelSpec, *, batch_size: int = 16, device: str = "auto", seed: int | None = None):
        self.spec = spec
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                                   ("cpu" if device == "auto" else device))
        self.tokenizer = build_tokenizer(spec)
        self.model = build_model(spec).to(self.device)
        self.batch_size = batch_size
        config = self.model.config
        self.max_length: int | None = getattr(config, "n_positions", None) or getattr(
            config, "max_position_embeddings", None)
        self.generator_seed = seed
        if seed is not None:
            torch.manual_seed(seed)

    def load_weights(self, blob: bytes) -> None:
        """Whole weights, or a LoRA adapter applied over the base weights this engine holds."""
        if is_adapter(blob):
            self.model = apply_adapter(self.model, blob)
            return
        load_weights(self._plain(), blob)

    def load_weight_files(self, paths: list) -> None:
        """Whole weights from safetensors buckets, streamed tensor by tensor into the model's dtype."""
        load_weight_files(self._plain(), paths)

    def _plain(self) -> torch.nn.Module:
        # Whole weights after adapters: back to a plain model. (Asked without importing peft, which
        # costs half a second the first time, inside the swap's pause.)
        if type(self.model).__module__.startswith("peft."):
            self.model = self.model.unload()
        return self.model

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        rows = [p for p in prompts for _ in range(n)]  # sample j of prompt i is row i*n + j
        samples: list[Sample] = []
        with torch.no_grad():
            for start in range(0, len(rows), self.batch_size):
                samples += self._generate_batch(rows[start:start + self.batch_size], params)
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]

    def logprobs(self, prompt: list[int], continuation: list[int], temperature: float) -> list[float]:
        ids = torch.tensor([prompt + continuation], device=self.device)
        with torch.no_grad():
            lp = sequence_logprobs(self.model, ids, torch.ones_like(ids), temperature)  # [1, T-1]
        return lp[0, len(prompt) - 1:].tolist()

    def _generate_batch(self, rows: list[list[int]], params: SamplingParams) -> list[Sample]:
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(r) for r in rows)
        new_tokens = params.max_new_tokens
        if self.max_length is not None:  # positions past the model's context do not exist
            new_tokens = min(new_tokens, self.max_length - width)
            if new_tokens < 1:
                raise ValueError(f"prompt of {width} tokens leaves no room in a context of {self.max_length}")
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)  # [B, P] left-padded
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        # generate() derives position ids from the attention mask, as schemas.logprobs.position_ids does.
        sampling = {"do_sample": False} if params.greedy else \
            {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
        out = self.model.generate(input_ids=ids, attention_mask=mask, **sampling, max_new_tokens=new_tokens,
                                  pad_token_id=pad, eos_token_id=eos)  # [B, P + N]
        responses = [self._cut(row.tolist(), eos) for row in out[:, width:]]
        if not params.logprobs:  # the scoring pass is a forward over every row: skipped when unasked
            return [Sample(tokens=t, text=self.tokenizer.decode(t, skip_special_tokens=True), logprobs=[],
                           finish_reason=reason) for t, reason in responses]
        return self._score(ids, mask, responses, params)

    @staticmethod
    def _cut(row: list[int], eos: int) -> tuple[list[int], Literal["stop", "length"]]:
        """The response up to and including the first EOS (generate pads after it)."""
        if eos in row:
            return row[:row.index(eos) + 1], "stop"
        return row, "length"

    def _score(self, ids: torch.Tensor, mask: torch.Tensor, responses: list[tuple[list[int], str]],
               params: SamplingParams) -> list[Sample]:
        """One scoring pass over left-padded prompt + right-padded response: [B, P + N]."""
        pad = self.tokenizer.pad_token_id
        longest = max(len(tokens) for tokens, _ in responses)
        resp = torch.tensor([t + [pad] * (longest - len(t)) for t, _ in responses], device=self.device)
        resp_mask = torch.tensor([[1] * len(t) + [0] * (longest - len(t)) for t, _ in responses],
                                 device=self.device)
        full, full_mask = torch.cat([ids, resp], 1), torch.cat([mask, resp_mask], 1)
        lp = sequence_logprobs(self.model, full, full_mask, params.temperature)[:, ids.shape[1] - 1:]  # [B, N]
        return [Sample(tokens=t, text=self.tokenizer.decode(t, skip_special_tokens=True),
                       logprobs=lp[i, :len(t)].tolist(), finish_reason=reason)
                for i, (t, reason) in enumerate(responses)]
