"""On-policy distillation's teacher served by vLLM's own OpenAI-compatible server: the log-probs the
`distill` stage reads back from it (completions, token ids in, `echo` + `logprobs`) equal the ones
transformers computes from the same weights in the stage's local path."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from undertow.kernel.models import ModelSpec, build_tokenizer
from undertow.processors.api import Reject
from undertow.processors.distill import Distill
from undertow.schemas import Experience
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

STARTUP_S = 300  # vLLM's server on 2 shared cores: tens of seconds, more under load


@pytest.fixture(scope="module")
def served(llama_dir, tmp_path_factory):
    """`vllm serve`'s API server on a free loopback port, as a user would start it; its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(llama_dir),
               "--served-model-name", "teacher", "--dtype", "float32", "--max-model-len", "256",
               "--host", "127.0.0.1", "--port", str(port), "--seed", "0",
               "--enforce-eager"]  # as the engine runs it (rollout/engines/vllm_engine.py): no graph capture
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/health", log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    def healthy() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False  # not listening yet

    wait_for(healthy, STARTUP_S, f"vLLM's server to answer {url}", proc=proc,
             state=lambda: f"its log ends:\n{log.read_text()[-3000:]}", every=0.5)


def records(llama_dir: Path) -> list[Experience]:
    """Prompts and responses of several lengths, as the tokenizer makes them; behaviour log-probs made up."""
    tok = build_tokenizer(ModelSpec(source="hf", path=str(llama_dir)))
    pairs = [("What is 12 + 7?", "19"), ("Name a colour.", "blue, or perhaps green"), ("Hi", "hello there!")]
    out = []
    for i, (prompt, response) in enumerate(pairs):
        p, r = tok.encode(prompt, add_special_tokens=False), tok.encode(response, add_special_tokens=False)
        out.append(Experience(experience_id=f"e{i}", task_id=f"t{i}", group_id=f"g{i}", prompt_tokens=p,
                              response_tokens=r, behaviour_logprobs=[-1.0] * len(r), policy_version=0,
                              finish_reason="stop"))
    return out


def test_a_served_teacher_gives_the_log_probs_the_local_teacher_computes(served, llama_dir):
    teacher = {"source": "hf", "path": str(llama_dir)}
    exps = records(llama_dir)
    local = Distill(teacher=teacher)
    local._load()
    remote = Distill(teacher=teacher, endpoint={"base_url": served, "model": "teacher", "timeout_s": 120})
    remote._load()
    expected, got = local.teacher_logprobs(exps), remote.teacher_logprobs(exps)
    assert [len(g) for g in got] == [len(e.response_tokens) for e in exps]
    for g, e in zip(got, expected):
        # Two engines, fp32 both: different kernels and summation orders; a token off by one position
        # would be off by whole nats (the tiny Llama's init_std 0.2 makes its distributions sharp).
        assert g == pytest.approx(e, abs=2e-3)
    out = remote.process_batch(exps)
    assert not any(isinstance(r, Reject) for r in out), out
    for exp, distilled, teacher_lp in zip(exps, out, got):
        assert distilled.advantages == pytest.approx([t + 1.0 for t in teacher_lp], abs=1e-6)
