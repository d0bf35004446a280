"""A vLLM engine with the transformers engine's interface. GPU only; UNTESTED in this repository.

vLLM cannot be installed on the CPU machines this project is developed on (it pins a CUDA torch),
so this file is kept thin and imports vllm only when the engine is built. Its behaviour log-probs
are vLLM's own ("processed_logprobs": after temperature, before top-p), which match
`schemas.logprobs` only to vLLM's kernel precision: check them against the trainer before relying
on them.
"""

from __future__ import annotations

from kernel.models import ModelSpec, build_tokenizer, local_dir

from rollout.engines.base import Sample, SamplingParams, engines


@engines.register("vllm")
class VLLMEngine:
    """vLLM's offline `LLM` on a local HF directory (or the cached GGUF conversion)."""

    def __init__(self, spec: ModelSpec, *, gpu_memory_utilization: float = 0.5, seed: int = 0):
        try:
            from vllm import LLM
        except ImportError as e:
            raise RuntimeError("engine 'vllm' needs the vllm package (GPU only): pip install undertow[vllm]") from e
        if spec.source == "tiny":
            raise ValueError("model.source: vllm cannot build the tiny model; use 'hf' or 'gguf'")
        self.tokenizer = build_tokenizer(spec)
        self.llm = LLM(model=local_dir(spec), dtype=spec.dtype, seed=seed,
                       gpu_memory_utilization=gpu_memory_utilization)

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        from vllm import SamplingParams as VSampling

        sampling = VSampling(n=n, temperature=params.temperature, top_p=params.top_p,
                             max_tokens=params.max_new_tokens, logprobs=0, logprobs_mode="processed_logprobs")
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling)
        return [[Sample(tokens=list(c.token_ids), text=c.text,
                        logprobs=[lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)],
                        finish_reason="stop" if c.finish_reason == "stop" else "length")
                 for c in out.outputs] for out in outs]

    def logprobs(self, prompt: list[int], continuation: list[int], temperature: float) -> list[float]:
        from vllm import SamplingParams as VSampling

        sampling = VSampling(max_tokens=1, temperature=temperature, prompt_logprobs=0)
        out = self.llm.generate([{"prompt_token_ids": prompt + continuation}], sampling)[0]
        ids = prompt + continuation
        return [out.prompt_logprobs[i][ids[i]].logprob for i in range(len(prompt), len(ids))]

    def load_weights(self, blob: bytes) -> None:
        from safetensors.torch import load

        tensors = load(blob)
        # In place on the running model (vLLM >= 0.6 exposes the driver worker's model this way).
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model.load_weights(weights=tensors.items())
