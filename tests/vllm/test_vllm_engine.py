"""The vLLM batch engine against real vLLM (CPU): log-probs the trainer's way, EOS and length, the
in-place weight swap and its refusals, a rollout worker that generates with it into the real broker.
Continuous batching (vllm_async) is tests/vllm/test_vllm_async.py.

One engine for the whole module (tests/vllm/conftest.py): vLLM takes tens of seconds to start.
"""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
from undertow.schemas import Experience, Rejected, Task, chunk_weights
from undertow.streams import RecordProducer, Topics
from undertow.rollout.engines import SamplingParams
from tests.helpers import load_run, read_all, wait_for, write_config
from tests.vllm.engine_checks import TOLERANCE, fields, prompts_of, worst_gap
from tests.vllm.trainer_logprobs import in_trainer_environment, trainer_logprobs

@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_the_trainers_recomputation(engine, spec, temperature):
    prompts = prompts_of(engine, "What is 2+3?", "Add 1 and 4, then say it twice please")
    groups = engine.generate(prompts, 3, SamplingParams(temperature=temperature, max_new_tokens=24))
    assert [len(g) for g in groups] == [3, 3]
    assert all(len(s.logprobs) == len(s.tokens) > 0 for g in groups for s in g)
    here = worst_gap(groups, prompts, lambda rows: trainer_logprobs(fields(spec), temperature, rows))
    # The trainer's own environment (torch, transformers of the main venv), not only this one's.
    there = worst_gap(groups, prompts, lambda rows: in_trainer_environment(fields(spec), temperature, rows))
    print(f"T={temperature}: max |vLLM - trainer| per token {here:.2e} (this env), {there:.2e} (trainer env)")
    assert here <= TOLERANCE and there <= TOLERANCE


def test_a_response_ends_at_eos_or_at_max_tokens(engine, spec, original):
    eos = engine.tokenizer.eos_token_id
    engine.load_weights(zeroed_head(spec))  # uniform: EOS comes 1 in ~90 tokens, so both endings occur
    try:
        samples = engine.generate(prompts_of(engine, "Say something"), 128, SamplingParams(max_new_tokens=12))[0]
    finally:
        engine.load_weights(original)
    for s in samples:
        if s.finish_reason == "stop":
            assert s.tokens[-1] == eos and eos not in s.tokens[:-1]
        else:
            assert len(s.tokens) == 12 and eos not in s.tokens
        assert s.text == engine.tokenizer.decode(s.tokens, skip_special_tokens=True)
    assert {s.finish_reason for s in samples} == {"stop", "length"}  # no stop in 128 x 12 tokens: p ~ 1e-7


def test_logprobs_of_a_given_continuation_are_the_trainers(engine, spec):
    prompt, continuation = prompts_of(engine, "What is 2+3?", "It is 5")
    for temperature in (1.0, 0.7):
        got = engine.logprobs(prompt, continuation, temperature)
        want = trainer_logprobs(fields(spec), temperature, [(prompt, continuation)])[0]
        assert len(got) == len(continuation)
        assert max(abs(a - b) for a, b in zip(got, want)) <= TOLERANCE


def test_greedy_takes_the_most_likely_token_and_keeps_the_trainers_logprobs(engine, spec):
    prompt = prompts_of(engine, "What is 2+3?")[0]
    for temperature in (1.0, 0.7):  # vLLM's greedy log-probs are at temperature 1: the engine rescores
        first, second = engine.generate([prompt], 2, SamplingParams(greedy=True, temperature=temperature,
                                                                    max_new_tokens=12))[0]
        assert first.tokens == second.tokens
        expected = trainer_logprobs(fields(spec), temperature, [(prompt, first.tokens)])[0]
        assert max(abs(a - b) for a, b in zip(first.logprobs, expected)) <= TOLERANCE
    model = build_model(spec)  # argmax at every step, under the trainer's model
    ids = torch.tensor([prompt + first.tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
    assert logits.argmax(-1).tolist() == first.tokens
    # Evaluation asks for no log-probs: the same answer, none computed (no rescoring at temperature 0.7).
    plain = engine.generate([prompt], 2, SamplingParams(greedy=True, temperature=0.7, max_new_tokens=12,
                                                        logprobs=False))[0]
    assert [s.tokens for s in plain] == [first.tokens] * 2 and all(s.logprobs == [] for s in plain)


def test_top_p_below_one_is_refused(engine):
    with pytest.raises(ValueError, match="rollout.sampling.top_p"):
        engine.generate(prompts_of(engine, "hi"), 1, SamplingParams(top_p=0.9))


def zeroed_head(spec: ModelSpec) -> bytes:
    model = build_model(spec)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    return weights_to_bytes(model)


def test_a_swap_changes_the_next_generations_in_place(engine, spec, original, tmp_path):
    from tests.vllm.tiny_llama import save_tiny_llama

    # Longer than two KV blocks (128 tokens each on CPU) and generated from before the swap:
    # vLLM has its prefix cached.
    prompts, params = prompts_of(engine, "Add the numbers 12, 30 and 7, then tell me the sum twice. " * 5), \
        SamplingParams(max_new_tokens=16)
    engine.generate(prompts, 2, params)
    uniform = -math.log(engine.llm.llm_engine.model_config.get_vocab_size())
    started = time.perf_counter()
    engine.load_weights(zeroed_head(spec))
    print(f"swap of the tiny model: {1000 * (time.perf_counter() - started):.1f} ms")
    flat = engine.generate(prompts, 4, params)[0]
    assert all(abs(lp - uniform) < 1e-5 for s in flat for lp in s.logprobs)
    other = save_tiny_llama(tmp_path / "other", seed=1)  # every layer differs, so would stale cached keys
    engine.load_weights(weights_to_bytes(build_model(ModelSpec(source="hf", path=str(other)))))
    try:
        groups = engine.generate(prompts, 4, params)
        other_model = {"source": "hf", "path": str(other)}
        assert worst_gap(groups, prompts, lambda rows: trainer_logprobs(other_model, 1.0, rows)) <= TOLERANCE
    finally:
        engine.load_weights(original)  # and back: the same engine generates with the first weights again
    groups = engine.generate(prompts, 4, params)
    assert worst_gap(groups, prompts, lambda rows: trainer_logprobs(fields(spec), 1.0, rows)) <= TOLERANCE


def test_bucket_files_stream_into_the_engine_and_a_misfit_is_refused_first(engine, spec, original, tmp_path):
    """The files and broadcast transports' path: many safetensors buckets, read one tensor at a time."""
    from safetensors.torch import load

    from undertow.kernel.models.weights import to_buckets
    from tests.vllm.tiny_llama import save_tiny_llama

    def written(tensors: dict, folder) -> list:
        folder.mkdir()
        paths = []
        for i, blob in enumerate(to_buckets(tensors, 64 << 10)):
            paths.append(folder / f"bucket-{i:04d}.safetensors")
            paths[-1].write_bytes(blob)
        return paths

    other = save_tiny_llama(tmp_path / "other", seed=2)
    tensors = load(weights_to_bytes(build_model(ModelSpec(source="hf", path=str(other)))))
    paths = written(tensors, tmp_path / "v1")
    assert len(paths) > 3
    prompts, params = prompts_of(engine, "What is 12+30?"), SamplingParams(max_new_tokens=8)
    name = "model.layers.0.mlp.down_proj.weight"
    with pytest.raises(ValueError, match=f"{name} has shape"):
        engine.load_weight_files(written({**tensors, name: tensors[name][:, :-1].contiguous()}, tmp_path / "bad"))
    groups = engine.generate(prompts, 2, params)  # the refused buckets changed nothing
    assert worst_gap(groups, prompts, lambda rows: trainer_logprobs(fields(spec), 1.0, rows)) <= TOLERANCE
    engine.load_weight_files(paths)
    try:
        groups = engine.generate(prompts, 2, params)
        other_model = {"source": "hf", "path": str(other)}
        assert worst_gap(groups, prompts, lambda rows: trainer_logprobs(other_model, 1.0, rows)) <= TOLERANCE
    finally:
        engine.load_weights(original)


def test_an_update_that_does_not_fit_is_refused_and_the_weights_stay(engine, spec, original):
    from safetensors.torch import load, save

    tensors = load(original)
    name = "model.layers.0.mlp.down_proj.weight"
    misshapen = save({**tensors, name: tensors[name][:, :-1].contiguous()})
    for blob, says in [(misshapen, f"{name} has shape"), (save({k: v for k, v in tensors.items() if k != name}),
                                                          "missing from the update"),
                       (save({**tensors, "extra.weight": torch.zeros(2)}), "not in the model")]:
        with pytest.raises(ValueError, match=says):
            engine.load_weights(blob)
    adapter = save({"a": torch.zeros(1)}, metadata={"undertow.lora": '{"rank": 2, "alpha": 4, "dropout": 0, '
                                                                     '"targets": ["q_proj"]}'})
    with pytest.raises(ValueError, match="adapter-only"):
        engine.load_weights(adapter)
    prompts = prompts_of(engine, "What is 2+3?")
    groups = engine.generate(prompts, 2, SamplingParams(max_new_tokens=8))
    assert worst_gap(groups, prompts, lambda rows: trainer_logprobs(fields(spec), 1.0, rows)) <= TOLERANCE


@pytest.mark.broker
def test_a_worker_generates_with_vllm_into_the_broker_and_swaps_from_the_topic(
        engine, spec, original, kafka, namespace, tmp_path, monkeypatch):
    import undertow.rollout.worker as rollout_worker
    from undertow.rollout.worker import RolloutWorker

    monkeypatch.setattr(rollout_worker, "build_engine", lambda entry, model: engine)  # the module's engine
    path = write_config(tmp_path / "run.yaml", namespace, model=fields(spec),
                        rollout={"engine": {"name": "vllm"}, "sampling": {"max_new_tokens": 8},
                                 "reward": "numeric_match", "max_staleness": 0})
    config, context = load_run(path, kafka)
    topics, worker = Topics(namespace), RolloutWorker(config.rollout, context, "w0")
    done = {}
    thread = threading.Thread(target=lambda: done.update(stats=worker.run(max_tasks=3)), daemon=True)
    thread.start()

    def experiences(task_id):
        return [e for e in read_all(kafka, topics.raw, Experience) if e.task_id == task_id]

    def publish(version: int, blob: bytes, corrupt: bool = False):
        chunks = chunk_weights(spec.name, version, blob, 64 << 10)
        if corrupt:  # same announced sha256, other bytes in one chunk
            chunks[1] = chunks[1].model_copy(update={"data": bytes(len(chunks[1].data))})
        for c in chunks:
            producer.send(topics.weights, c, key=spec.name)
        producer.flush()

    try:
        with RecordProducer(kafka) as producer:
            producer.send(topics.tasks, Task(task_id="t1", prompt="What is 2+3?", answer="5", group_size=3), key="t1")
            producer.flush()
            first = wait_for(lambda: len(experiences("t1")) == 3 and experiences("t1"), what="t1's experiences")
            publish(1, zeroed_head(spec))
            wait_for(lambda: worker.subscriber.latest_announced == 1, what="v1 announced")
            producer.send(topics.tasks, Task(task_id="t2", prompt="What is 1+1?", answer="2", group_size=2), key="t2")
            producer.flush()
            second = wait_for(lambda: experiences("t2"), what="t2's experiences")
            worker.admission.max_staleness = 1  # so that t3 goes through on v1 once v2 is refused
            publish(2, original, corrupt=True)
            wait_for(lambda: worker.subscriber.refused == [2], what="v2 refused")
            producer.send(topics.tasks, Task(task_id="t3", prompt="What is 2+2?", answer="4", group_size=2), key="t3")
            producer.flush()
        thread.join(timeout=120)
        assert not thread.is_alive() and done["stats"].tasks == 3 and done["stats"].weight_swaps == 1
        third = experiences("t3")
    finally:
        engine.load_weights(original)

    assert {e.policy_version for e in first} == {0} and {e.policy_version for e in second + third} == {1}
    rows = [(e.prompt_tokens, e.response_tokens) for e in first]
    for e, lp in zip(first, in_trainer_environment(fields(spec), 1.0, rows)):
        assert len(e.behaviour_logprobs) == len(e.response_tokens) > 0
        assert max(abs(a - b) for a, b in zip(e.behaviour_logprobs, lp)) <= TOLERANCE
    uniform = -math.log(engine.llm.llm_engine.model_config.get_vocab_size())
    assert all(abs(lp - uniform) < 1e-5 for e in second + third for lp in e.behaviour_logprobs)  # v1 generated them
    refused = [r for r in read_all(kafka, topics.rejected, Rejected) if r.stage == "weights"]
    assert len(refused) == 1 and refused[0].reason == "checksum"
