"""TRL's GRPOTrainer on an undertow config's problem: the peer arm of benchmarks/peers/trl_vs_undertow.py.

    ~/.cache/undertow/peers-venv/bin/python benchmarks/peers/trl_grpo.py \\
        --config examples/smollm2_arithmetic_vllm.yaml --minutes 40 --out runs/peers/trl

Everything that defines the problem comes from the undertow config, so that both arms cannot drift
apart: the model (built by undertow's own builders: the same GGUF conversion and tokenizer), the
training tasksets' items, the reward (undertow's reward function, called through TRL's reward hook),
the group size, prompts per step, learning rate and schedule, Adam's settings, gradient clipping,
temperature, top-p and new tokens. Everything else is TRL's default (`trl_settings` lists what is
set and why). Generation is TRL's own (transformers' generate), synchronous, as TRL runs on a CPU.

The run is bounded in wall time from this process's start (imports and model loading included, as
undertow's arm counts its start-up). The whole model is saved every --save-every-minutes and at the
bound into OUT/checkpoints/checkpoint-STEP/, each listed in OUT/arm.json with the seconds at which it
was on disk; TRL's per-step logs go to OUT/log.jsonl.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the heavy imports: the arm's clock includes its start-up

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def trl_settings(cfg: Any, out: Path) -> dict[str, Any]:
    """GRPOConfig's arguments for the undertow run config `cfg`: the problem's settings taken from it,
    the rest TRL's defaults (named here where a default would differ from undertow's run)."""
    trainer, sampling = cfg.trainer, cfg.rollout.sampling
    group = cfg.feeder.group_size
    if trainer.batching.experiences % group:
        raise ValueError(f"trainer.batching.experiences {trainer.batching.experiences} is not whole groups of {group}")
    prompts = trainer.batching.experiences // group
    engine = trainer.engine
    if engine.schedule.name != "constant" or engine.schedule.warmup_steps:
        raise ValueError("trl_grpo: only a constant learning rate is mapped (TRL's default decays it linearly)")
    if trainer.lora is not None:
        raise ValueError("trl_grpo: LoRA runs are not mapped (whole weights only)")
    return {
        "output_dir": str(out / "checkpoints"),
        "num_generations": group,
        # One optimizer step = `prompts` groups, in micro-batches of one group (undertow's 512-token
        # micro-batches hold about 8 of these ~60-token rows).
        "per_device_train_batch_size": group,
        "gradient_accumulation_steps": prompts,
        "learning_rate": engine.lr,
        "lr_scheduler_type": "constant",  # TRL's default is linear decay to 0 over max_steps
        "weight_decay": engine.weight_decay,
        "adam_beta1": engine.betas[0],
        "adam_beta2": engine.betas[1],
        "max_grad_norm": engine.grad_clip,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_completion_length": sampling.max_new_tokens,
        "beta": 0.0,  # no KL term, as the undertow run (TRL's default too)
        "loss_type": "dapo",  # token mean over the step's tokens: undertow's token_mean (TRL's default)
        "bf16": False,  # fp32 as undertow's trainer on a CPU (TRL would default to bf16)
        "use_cpu": True,
        "max_steps": 100_000,  # the wall-clock bound stops it
        "save_strategy": "no",  # saves come from the wall clock (WallClock below)
        "save_only_model": True,
        "logging_steps": 1,
        "report_to": "none",
        "seed": 0,
    }


def training_rows(cfg: Any) -> list[dict[str, Any]]:
    """The feeder's training items as TRL's dataset rows: the prompt as undertow's workflow renders
    it (one user message through the chat template, or the raw text) and the reference answer."""
    from undertow.rollout.feeder.items import load_items

    rows = []
    for taskset in cfg.feeder.tasksets:
        for item in load_items(taskset.source):
            if item.messages or cfg.rollout.chat_template:
                prompt: Any = item.messages or [{"role": "user", "content": item.prompt}]
            else:
                prompt = item.prompt
            rows.append({"prompt": prompt, "answer": item.answer, "task_id": f"{taskset.name}/{item.key}"})
    return rows


def reward_hook(cfg: Any) -> Callable[..., list[float]]:
    """The undertow config's reward as TRL calls a reward function: the completions (text, or chat
    messages whose last is the answer) and the dataset's columns as lists."""
    from undertow.rollout.rewards import build_reward, total
    from undertow.rollout.rewards.registry import NoVerdict
    from undertow.schemas import Task

    reward = build_reward(cfg.rollout.reward, timeout_s=cfg.rollout.reward_timeout_s)

    def undertow_reward(prompts: list[Any], completions: list[Any], answer: list[str | None],
                        task_id: list[str], **_: Any) -> list[float]:
        scores = []
        for prompt, completion, expected, key in zip(prompts, completions, answer, task_id):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            task = Task(task_id=key, answer=expected, **({"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}))
            try:
                scores.append(total(reward(text, task)))
            except NoVerdict:  # as undertow's worker: no verdict is no reward, not a crash
                scores.append(0.0)
        return scores

    return undertow_reward


def wall_clock(minutes: float, save_every_minutes: float, out: Path) -> Any:
    """A TRL callback: save every `save_every_minutes`, stop (saving) at `minutes`, both from STARTED;
    each save listed in OUT/arm.json, each log line in OUT/log.jsonl."""
    from transformers import TrainerCallback

    class WallClock(TrainerCallback):
        def __init__(self) -> None:
            self.next_save = 60 * save_every_minutes
            self.saves: list[dict[str, Any]] = []

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            elapsed = time.time() - STARTED
            if elapsed >= 60 * minutes:
                control.should_training_stop = control.should_save = True
            elif elapsed >= self.next_save:
                control.should_save = True
                self.next_save += 60 * save_every_minutes
            return control

        def on_save(self, args, state, control, **kwargs):  # noqa: ANN001
            self.saves.append({"step": state.global_step, "seconds": time.time() - STARTED,
                               "path": str(Path(args.output_dir) / f"checkpoint-{state.global_step}")})
            (out / "arm.json").write_text(json.dumps({"arm": "trl", "saves": self.saves}, indent=1))

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            with open(out / "log.jsonl", "a") as f:
                f.write(json.dumps({"step": state.global_step, "seconds": time.time() - STARTED, **(logs or {})}) + "\n")

    return WallClock()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "smollm2_arithmetic_vllm.yaml")
    ap.add_argument("--minutes", type=float, default=40.0, help="wall-clock bound, start-up included")
    ap.add_argument("--save-every-minutes", type=float, default=5.0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from undertow.infra.run.config import load_component_config
    from undertow.kernel.models.builders import build_model, build_tokenizer

    cfg = load_component_config(args.config)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = trl_settings(cfg, args.out)
    (args.out / "settings.json").write_text(json.dumps(settings, indent=1))
    tokenizer = build_tokenizer(cfg.model)
    trainer = GRPOTrainer(model=build_model(cfg.model), reward_funcs=[reward_hook(cfg)],
                          args=GRPOConfig(**settings), train_dataset=Dataset.from_list(training_rows(cfg)),
                          processing_class=tokenizer,
                          callbacks=[wall_clock(args.minutes, args.save_every_minutes, args.out)])
    trainer.train()
    print(f"trl: {trainer.state.global_step} steps in {time.time() - STARTED:.0f} s; checkpoints in {args.out / 'arm.json'}")


if __name__ == "__main__":
    main()
