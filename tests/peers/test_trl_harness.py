"""The TRL comparison's harness (benchmarks/peers): the peer gets the problem undertow gets (the same
settings, prompts and rewards), its arm trains and saves on the wall clock, and the one evaluator
scores a checkpoint as a freshly built engine would. The 40-minute comparison is a benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from undertow.infra.run.config import load_component_config

ROOT = Path(__file__).resolve().parents[2]
PEERS_PYTHON = Path(os.environ.get("UNDERTOW_CACHE", Path.home() / ".cache" / "undertow")) / "peers-venv" / "bin" / "python"
ARITHMETIC = ROOT / "examples" / "smollm2_arithmetic_vllm.yaml"
sys.path.insert(0, str(ROOT))

from benchmarks.peers.trl_grpo import reward_hook, training_rows, trl_settings  # noqa: E402


def peers(code: str) -> str:
    """Run `code` in the peers' environment (TRL), as the benchmark does; its stdout."""
    assert PEERS_PYTHON.exists(), f"no peers' environment at {PEERS_PYTHON}: bash infra/bootstrap.sh --peers"
    done = subprocess.run([str(PEERS_PYTHON), "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def tiny_config(tmp_path: Path, **overrides) -> Path:
    config = {"namespace": "trl-tiny", "model": {"source": "tiny"},
              "feeder": {"tasksets": [{"name": "sums", "source": {"name": "sums", "size": 50}}], "group_size": 4},
              "rollout": {"sampling": {"temperature": 1.0, "max_new_tokens": 4}, "reward": "numeric_match",
                          "chat_template": False},
              "eval": {"tasksets": [{"name": "held", "source": {"name": "sums", "size": 16, "seed": 1}}], "samples": 0},
              "trainer": {"engine": {"lr": 1.0e-3}, "batching": {"experiences": 8}}, **overrides}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_trl_gets_the_configs_problem(tmp_path):
    """Group, prompts per step, optimizer and sampling come from the config; TRL's defaults that
    would differ from undertow's run (bf16, a decaying lr) are overridden."""
    s = trl_settings(load_component_config(ARITHMETIC), tmp_path)
    assert (s["num_generations"], s["per_device_train_batch_size"], s["gradient_accumulation_steps"]) == (8, 8, 4)
    assert (s["learning_rate"], s["temperature"], s["top_p"], s["max_completion_length"]) == (1e-5, 0.7, 1.0, 16)
    assert (s["beta"], s["bf16"], s["lr_scheduler_type"], s["max_grad_norm"], s["weight_decay"]) == (0.0, False, "constant", 1.0, 0.0)
    lora = load_component_config(tiny_config(tmp_path, trainer={"lora": {"rank": 4}, "batching": {"experiences": 8}}))
    with pytest.raises(ValueError, match="LoRA"):
        trl_settings(lora, tmp_path)
    partial = load_component_config(tiny_config(tmp_path, trainer={"batching": {"experiences": 6}}))
    with pytest.raises(ValueError, match="whole groups"):
        trl_settings(partial, tmp_path)


def test_the_reward_hook_scores_what_undertows_reward_scores():
    """TRL's call (chat completions, the dataset's columns as lists) gives numeric_match's verdicts,
    known by hand: right, wrong, a number then words, no number."""
    cfg = load_component_config(ARITHMETIC)
    rows = training_rows(cfg)[:4]
    answers = [r["answer"] for r in rows]
    said = [answers[0], str(int(answers[1]) + 1), f"{answers[2]} is the answer.", "I do not know"]
    hook = reward_hook(cfg)
    got = hook(prompts=[r["prompt"] for r in rows], completions=[[{"role": "assistant", "content": t}] for t in said],
               answer=answers, task_id=[r["task_id"] for r in rows], completion_ids=[[1]] * 4, trainer_state=None)
    assert got == [1.0, 0.0, 1.0, 0.0]


def test_trl_renders_the_prompt_tokens_undertows_workflow_renders():
    """The same chat template, the same tokenizer: TRL's prompt ids equal the rollout worker's."""
    from undertow.kernel.models.builders import build_tokenizer
    from undertow.rollout.workflows.base import prompt_tokens
    from undertow.schemas import Task

    cfg = load_component_config(ARITHMETIC)
    rows = training_rows(cfg)[:3]
    ctx = type("Ctx", (), {"engine": type("E", (), {"tokenizer": build_tokenizer(cfg.model)}), "chat_template": True})
    ours = [prompt_tokens(Task(task_id=r["task_id"], prompt=r["prompt"][0]["content"], answer=r["answer"]), ctx)[1]
            for r in rows]
    theirs = json.loads(peers(f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from trl.data_utils import maybe_apply_chat_template
from undertow.infra.run.config import load_component_config
from undertow.kernel.models.builders import build_tokenizer
from benchmarks.peers.trl_grpo import training_rows
cfg = load_component_config({str(ARITHMETIC)!r})
tok = build_tokenizer(cfg.model)
texts = [maybe_apply_chat_template({{"prompt": r["prompt"]}}, tok)["prompt"] for r in training_rows(cfg)[:3]]
print(json.dumps([tok(t, add_special_tokens=False)["input_ids"] for t in texts]))
"""))
    assert theirs == ours and len(ours[0]) > 20
    # Independently of both renderers: the ids read back as SmolLM2's chat format around the question.
    text = ctx.engine.tokenizer.decode(ours[0])
    assert f"<|im_start|>user\n{rows[0]['prompt'][0]['content']}<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_the_trl_arm_trains_saves_on_the_clock_and_its_checkpoint_scores_as_a_fresh_engine(tmp_path):
    """A few seconds of TRL's GRPOTrainer on a tiny model: steps logged with the hook's rewards, a
    save listed with its time; the one evaluator, swapping that checkpoint into the engine it built
    on the starting weights, scores it as an engine built on it does, and unlike the start."""
    config, out = tiny_config(tmp_path), tmp_path / "trl"
    done = subprocess.run([str(PEERS_PYTHON), "benchmarks/peers/trl_grpo.py", "--config", str(config), "--minutes", "0.05",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saves = json.loads((out / "arm.json").read_text())["saves"]
    steps = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert saves and saves[-1]["step"] >= 1 and 0 < saves[-1]["seconds"] < 60
    assert any("rewards/undertow_reward/mean" in s for s in steps)
    # Other weights under the checkpoint's name, made to answer differently: a final layer norm that
    # outputs EOS's embedding, so every greedy answer is EOS alone (the start's run to max_new_tokens).
    import torch

    from undertow.kernel.models.builders import build_model, build_tokenizer

    cfg = load_component_config(config)
    model, eos = build_model(cfg.model), build_tokenizer(cfg.model).eos_token_id
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(8 * model.transformer.wte.weight[eos])
    model.save_pretrained(Path(saves[-1]["path"]), safe_serialization=True)
    done = subprocess.run([sys.executable, "benchmarks/peers/score_checkpoints.py", "--config", str(config), str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((out / "scores.json").read_text())
    from undertow.rollout.eval_runner import evaluate_checkpoint

    fresh = evaluate_checkpoint(cfg.eval, cfg.rollout, cfg.model, Path(saves[-1]["path"]))[0]
    figures = lambda r: (r["greedy_accuracy"], r["mean_reward"], r["mean_response_tokens"])  # noqa: E731
    assert figures(rows[-1]) == (fresh.greedy_accuracy, fresh.mean_reward, fresh.mean_response_tokens)
    assert rows[0]["step"] == 0 and rows[0]["mean_response_tokens"] == 4 and rows[-1]["mean_response_tokens"] == 1
