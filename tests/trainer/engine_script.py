"""Run by test_engine.py (alone, or under torchrun): two optimizer steps on fixed experiences.

Each rank writes the sha256 of the weights it holds, and rank 0 the gathered safetensors blob.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from kernel.models import weights_to_bytes
from trainer.config import AlgorithmConfig, EngineConfig
from trainer.engine import build_engine, gathered_weights, setup_process
from trainer.objectives import objectives
from trainer.step import train_step

from tests.trainer.helpers import SPEC, make_group


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--engine", default="{}", help="EngineConfig as JSON")
    args = ap.parse_args()
    cfg = EngineConfig.model_validate(json.loads(args.engine))
    process = setup_process(cfg.master_port)
    engine = build_engine(SPEC, cfg, process)
    rl = objectives.get("rl")(AlgorithmConfig())
    records = [e for g in range(2) for e in make_group(f"g{g}")]
    losses = [train_step(engine, rl, records, None, process, pad_id=0, pad_to_multiple=8)["loss"] for _ in range(2)]
    blob = gathered_weights(engine)
    out = Path(args.out)
    local = {"losses": losses}
    if engine.zero_optimization_stage() < 3:
        local["sha256"] = hashlib.sha256(weights_to_bytes(engine.module)).hexdigest()
    (out / f"rank{process.rank}.json").write_text(json.dumps(local))
    if process.is_leader:
        (out / "weights.safetensors").write_bytes(blob)


if __name__ == "__main__":
    main()
