"""Shared by the trainer tests: experiences of the tiny model, configs, and topic readers."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import torch

from undertow.kernel.models import ModelSpec, build_model, build_tokenizer
from undertow.schemas import Experience
from undertow.schemas.logprobs import sequence_logprobs
from tests.helpers import env, produce, read_all, write_config as write_run_config  # noqa: F401 — produce, read_all: the trainer tests import them from here

SPEC = ModelSpec()
PYTHON = sys.executable
PROMPT, GOOD, BAD = "2+2=", "4", "5"


def behaviour_logprobs(prompt: list[int], response: list[int], model=None) -> list[float]:
    model = model or build_model(SPEC)
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logp = sequence_logprobs(model, ids, torch.ones_like(ids))[0]
    return logp[len(prompt) - 1:].tolist()


def make_group(group_id: str, *, size: int = 4, version: int = 0, model=None, text: str = PROMPT) -> list[Experience]:
    """Half the samples answer GOOD (advantage +1), half BAD (−1) to the prompt `text`; behaviour
    log-probs of the v0 model."""
    tok = build_tokenizer(SPEC)
    prompt = tok(text)["input_ids"]
    out = []
    for i in range(size):
        text, adv = (GOOD, 1.0) if i % 2 == 0 else (BAD, -1.0)
        response = tok(text)["input_ids"] + [tok.eos_token_id]
        out.append(Experience(experience_id=f"{group_id}/{i}", task_id=group_id, group_id=group_id,
                              group_size=size, sample_index=i, prompt_text=text, prompt_tokens=prompt,
                              response_text=text, response_tokens=response,
                              behaviour_logprobs=behaviour_logprobs(prompt, response, model),
                              reward=max(adv, 0.0), advantages=[adv] * len(response), policy_version=version,
                              finish_reason="stop"))
    return out


def write_config(directory: Path, namespace: str, trainer: dict) -> Path:
    """`directory/run.yaml` with the trainer section (checkpoints under `directory/ckpt`)."""
    return write_run_config(directory / "run.yaml", namespace,
                            trainer={"checkpoint_dir": str(directory / "ckpt"), **trainer})


def trainer_env(port: int | None = None) -> dict[str, str]:
    """A trainer's environment; without `port` it picks a free one itself (trainer/engine.py): a fixed
    port made two trainers on the suite's two workers collide (EADDRINUSE) when they ran at once."""
    return env(MASTER_PORT=str(port)) if port else env()


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Wait for the trainer; a hung one is aborted (tracebacks in its output) and fails the test."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, _ = proc.communicate(timeout=30)
        raise AssertionError(f"trainer hung; its output:\n{out[-20000:]}") from None
    assert proc.returncode == 0, out[-20000:]
    return out


def start_trainer(config: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-m", "undertow.infra.cli", "train", str(config), *args], env=trainer_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=Path(__file__).resolve().parents[2])
