"""Run by test_engine.py (alone, or under torchrun): optimizer steps on fixed experiences.

Each rank writes the sha256 of the weights it holds and every step's metrics; rank 0 also the
gathered safetensors blob.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
from pathlib import Path

from safetensors.torch import save

from undertow.kernel.models import weights_to_bytes
from undertow.trainer.checkpoint import TrainerState, load_checkpoint, save_checkpoint
from undertow.trainer.config import AlgorithmConfig, EngineConfig, TrainerConfig
from undertow.trainer.critic import build_critic
from undertow.trainer.engine import build_training_engine, collective_failed, gathered_weights, setup_process
from undertow.trainer.runner import _guarded_step
from undertow.trainer.objectives import objectives
from undertow.trainer.step import StepShape, train_step

from tests.trainer.helpers import PROMPT, SPEC, make_group


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--engine", default="{}", help="EngineConfig as JSON")
    ap.add_argument("--algorithm", default="{}", help="AlgorithmConfig as JSON")
    ap.add_argument("--shape", default="{}", help="StepShape as JSON")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompt", default=PROMPT, help="every group's prompt (a long one runs once per micro-batch)")
    ap.add_argument("--poison", action="store_true", help="one experience's advantages are inf")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    ap.add_argument("--critic", default=None, help="CriticConfig as JSON (PPO: with advantage_transform gae)")
    ap.add_argument("--resume", default=None, help="a checkpoint directory: load it first, save to it last")
    ap.add_argument("--rank-gone", action="store_true", help="rank 1 leaves; rank 0 runs one guarded step")
    args = ap.parse_args()
    cfg = EngineConfig.model_validate(json.loads(args.engine))
    process = setup_process(cfg.master_port, cfg.collective_timeout_s)
    engine = build_training_engine(SPEC, cfg, process, gradient_checkpointing=args.checkpointing)
    trainer = TrainerConfig(engine=cfg, algorithm=AlgorithmConfig.model_validate(json.loads(args.algorithm)),
                            critic=json.loads(args.critic) if args.critic else None)
    rl = objectives.get("rl")(trainer.algorithm)
    critic = build_critic(SPEC, trainer, process)
    state = TrainerState()
    if args.resume:
        state = load_checkpoint(engine, Path(args.resume), critic.model if critic else None) or state
    records = [e for g in range(2) for e in make_group(f"g{g}", text=args.prompt)]
    if args.poison:
        records[3] = records[3].model_copy(update={"advantages": [math.inf] * len(records[3].response_tokens)})
    shape = StepShape(**json.loads(args.shape))
    if args.rank_gone:
        rank_gone(engine, rl, records, process, shape, Path(args.out))
    results = [train_step(engine, rl, records, None, process, pad_id=0, shape=shape, critic=critic)
               for _ in range(args.steps)]
    if args.resume:
        state.step += args.steps
        save_checkpoint(engine, Path(args.resume), state, leader=process.is_leader, keep=2,
                        critic=critic.model if critic else None)
    blob = gathered_weights(engine, lambda tensors, _: save(tensors))
    out = Path(args.out)
    local = {"losses": [r.metrics["loss"] for r in results], "metrics": [r.metrics for r in results],
             "untrained": [[e.experience_id for e in r.untrained] for r in results]}
    if engine.zero_optimization_stage() < 3:
        local["sha256"] = hashlib.sha256(weights_to_bytes(engine.module)).hexdigest()
        if critic is not None:
            local["critic"] = {k: v.tolist() for k, v in critic.model.module.state_dict().items()
                               if k.startswith("head.") or k.endswith("ln_f.weight")}
            local["critic_sha256"] = hashlib.sha256(weights_to_bytes(critic.model.module)).hexdigest()
    (out / f"rank{process.rank}.json").write_text(json.dumps(local))
    if process.is_leader:
        (out / "weights.safetensors").write_bytes(blob)


def rank_gone(engine, objective, records, process, shape: StepShape, out: Path) -> None:
    """Rank 1 leaves; rank 0's guarded step meets a broken group: it must raise (the trainer restarts),
    not dead-letter a batch that did nothing wrong. Rank 0 writes what happened."""
    if not process.is_leader:
        os._exit(0)
    try:
        result = _guarded_step(engine, objective, records, None, process, 0, shape, None, failures=0)
        found = {"raised": None, "failure": result.failure}
    except Exception as e:  # noqa: BLE001 - what it raised is the finding
        found = {"raised": type(e).__name__, "message": str(e)[:300], "collective": collective_failed(e)}
    (out / "rank0.json").write_text(json.dumps(found))
    os._exit(0)  # no teardown: the group is broken

if __name__ == "__main__":
    main()
