"""The trainer's recomputation, run in the main environment (torch and transformers of the trainer):

    python -m tests.vllm.trainer_logprobs < {"model": SPEC, "temperature": T, "rows": [[prompt, response], ...]}

prints one list of log-probs per row, as the trainer computes them (right-padded batch, schemas.logprobs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def trainer_logprobs(model: dict, temperature: float, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """`model`: the ModelSpec's fields (source, path, init_from), as the trainer builds it."""
    import torch

    from undertow.kernel.models import ModelSpec, build_model
    from undertow.schemas.logprobs import sequence_logprobs

    policy = build_model(ModelSpec(**model))
    seqs = [p + r for p, r in rows]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    with torch.no_grad():
        lp = sequence_logprobs(policy, ids, mask, temperature)  # [B, T-1]
    return [lp[i, len(p) - 1:len(seqs[i]) - 1].tolist() for i, (p, _) in enumerate(rows)]


def in_trainer_environment(model: dict, temperature: float,
                           rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """`trainer_logprobs` in the main venv (a subprocess), not in the vLLM one this test runs in."""
    return in_main_environment("tests.vllm.trainer_logprobs", {"model": model, "temperature": temperature, "rows": rows})


def in_main_environment(module: str, job: object) -> object:
    """Run `python -m module` in the main venv with `job` as JSON on stdin; its last line, parsed."""
    cache = Path(os.environ.get("UNDERTOW_CACHE", Path.home() / ".cache" / "undertow"))
    python = cache / "venv" / "bin" / "python"
    assert python.exists(), f"the main environment {python} is missing: bash infra/bootstrap.sh"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([str(python), "-m", module], cwd=root, check=True, text=True, capture_output=True,
                         input=json.dumps(job))
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    job = json.load(sys.stdin)
    print(json.dumps(trainer_logprobs(job["model"], job["temperature"], job["rows"])))
