"""The DeepSpeed engine on CPU: two gloo processes with micro-batches agree with one process in one
pass; ZeRO-3 with DeepSpeedCPUAdam and offload matches ZeRO-0 with torch AdamW; decoupled PPO's clip
binds on a second epoch; a non-finite step is skipped on every rank."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from undertow.kernel.models import build_model, load_weights

from undertow.trainer.engine import free_port

from .helpers import PYTHON, SPEC, trainer_env

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def run_script(out: Path, engine: dict, nproc: int = 1, *args: str, shape: dict | None = None,
               algorithm: dict | None = None, critic: dict | None = None, ranks: int | None = None) -> list[dict]:
    """Each rank's output: losses, metrics per step, untrained ids, and the sha256 of its weights."""
    out.mkdir()
    port = free_port()  # each run its own: fixed ports collided between the suite's two workers
    launcher = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(port)] \
        if nproc > 1 else [PYTHON]
    cmd = [*launcher, "tests/trainer/engine_script.py", "--out", str(out),
           "--engine", json.dumps({**engine, "master_port": port}), "--shape", json.dumps(shape or {}),
           "--algorithm", json.dumps(algorithm or {}), *(["--critic", json.dumps(critic)] if critic else []), *args]
    env = trainer_env(port)
    # the repository root for `tests.`; a caller's own path after it (a worktree's package link)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc if ranks is None else ranks)]


def loaded(out: Path) -> torch.nn.Module:
    model = build_model(SPEC)
    load_weights(model, (out / "weights.safetensors").read_bytes())
    return model


def test_two_ranks_in_micro_batches_train_what_one_pass_trains(tmp_path: Path):
    # 8 sequences of 6-7 tokens padded to 8: 16 tokens a micro-batch, 2 per rank, 2 ranks
    ranks = run_script(tmp_path / "two", {"zero_stage": 2, "lr": 0.01}, 2, shape={"micro_batch_tokens": 16},
                       algorithm={"entropy_coef": 0.01})
    assert ranks[0]["sha256"] == ranks[1]["sha256"]
    untimed = lambda rank: [{k: v for k, v in m.items() if k not in ("step_s", "tokens_per_s")} for m in rank["metrics"]]
    assert untimed(ranks[0]) == untimed(ranks[1])  # reduced over the ranks
    initial, trained = build_model(SPEC).state_dict(), loaded(tmp_path / "two").state_dict()
    assert any(not torch.equal(initial[k], trained[k]) for k in trained)
    micro = run_script(tmp_path / "micro", {"zero_stage": 0, "lr": 0.01}, shape={"micro_batch_tokens": 16},
                       algorithm={"entropy_coef": 0.01})
    whole = run_script(tmp_path / "whole", {"zero_stage": 0, "lr": 0.01}, algorithm={"entropy_coef": 0.01})
    # The gradient (its norm) and the second step's loss agree in fp32. Adam's first step moves each
    # weight by about ±lr whatever the gradient's size, so a weight whose gradient is ~0 moves by
    # rounding noise, which Adam's normalisation can make a sizeable part of a step (1.6% on two of 192
    # weights on one machine, 2026-12-03): weights agree to a tenth of a step. (Adam being scale-free,
    # the gradient norms and losses above are what would catch a wrongly scaled accumulation.)
    expected = loaded(tmp_path / "whole").state_dict()
    for run in (micro, ranks):
        assert [m["grad_norm"] for m in run[0]["metrics"]] == \
            pytest.approx([m["grad_norm"] for m in whole[0]["metrics"]], rel=1e-5)
        assert run[0]["losses"] == pytest.approx(whole[0]["losses"], abs=1e-6)
    for name, got in loaded(tmp_path / "micro").state_dict().items():
        torch.testing.assert_close(got, expected[name], atol=1e-3, rtol=0)
        torch.testing.assert_close(trained[name], expected[name], atol=1e-3, rtol=0)


def test_zero3_cpu_adam_offload_matches_zero0_adamw(tmp_path: Path):
    run_script(tmp_path / "z0", {"zero_stage": 0, "lr": 0.01})
    run_script(tmp_path / "z3", {"zero_stage": 3, "lr": 0.01, "optimizer": "cpu_adam", "offload_optimizer": True})
    z0, z3 = loaded(tmp_path / "z0").state_dict(), loaded(tmp_path / "z3").state_dict()
    initial = build_model(SPEC).state_dict()
    # Adam's early steps move each weight by about lr (0.01); the two optimizers agree to 1% of that
    # (they differ only where a gradient is near Adam's eps).
    assert max((z0[k] - initial[k]).abs().max().item() for k in z0) > 0.01
    for name in z0:
        torch.testing.assert_close(z3[name], z0[name], atol=1e-4, rtol=0)
    loss0 = json.loads((tmp_path / "z0" / "rank0.json").read_text())["losses"]
    loss3 = json.loads((tmp_path / "z3" / "rank0.json").read_text())["losses"]
    assert loss0 == pytest.approx(loss3, abs=1e-5) and loss0[0] != loss0[1]


def test_decoupled_ppo_clips_on_the_second_epoch(tmp_path: Path):
    algorithm = {"policy_loss": "decoupled_ppo"}
    once = run_script(tmp_path / "once", {"lr": 0.05}, algorithm=algorithm, shape={"ppo_epochs": 1})
    twice = run_script(tmp_path / "twice", {"lr": 0.05}, 1, "--steps", "1", algorithm=algorithm,
                       shape={"ppo_epochs": 2, "micro_batch_tokens": 16})
    # One update: the proximal policy is the current one, r = 1, nothing clips.
    assert once[0]["metrics"][0]["clip_fraction"] == 0 and once[0]["metrics"][0]["updates"] == 1
    # The second epoch's ratio is against the weights before the first update: it moved past 1 ± 0.2.
    m = twice[0]["metrics"][0]
    assert m["updates"] == 2 and m["clip_fraction"] > 0.05 and m["ratio_max"] > 1.2


@pytest.mark.parametrize("zero_stage,nproc", [(0, 1), (2, 2)])
def test_a_non_finite_step_is_skipped_on_every_rank(tmp_path: Path, zero_stage: int, nproc: int):
    # A 20-token prompt: each rank's rows run it once (objectives/shared_prefix.py), under ZeRO-2 too.
    ranks = run_script(tmp_path / "nan", {"zero_stage": zero_stage, "lr": 0.01}, nproc,
                       "--poison", "--steps", "1", "--prompt", "Answer briefly. 2+2=")
    assert len({r["sha256"] for r in ranks}) == 1
    initial, kept = build_model(SPEC).state_dict(), loaded(tmp_path / "nan").state_dict()
    assert all(torch.equal(initial[k], kept[k]) for k in kept)  # weights unchanged
    m = ranks[0]["metrics"][0]
    assert m["updates"] == 0 and m["skipped_updates"] == 1 and len(ranks[0]["untrained"][0]) == 8


PPO = {"advantage_transform": {"name": "gae", "lam": 0.95}}


def test_ppo_with_a_critic_trains_the_same_on_two_ranks_in_micro_and_mini_batches(tmp_path: Path):
    """The critic is a second DeepSpeed engine: its values once per step over the whole batch (GAE, whitened
    over the whole step: the once-per-step pass every advantage transform runs; tests/trainer/test_step.py
    checks batch_whiten and reinforce_pp on simulated ranks), its clipped value loss in every update beside
    the policy's. Two ZeRO-2 ranks in micro-batches and two mini-batches train both models as one process
    does in whole passes."""
    critic = {"lr": 0.01, "value_clip": 0.2}
    whole = run_script(tmp_path / "whole", {"zero_stage": 0, "lr": 0.01}, shape={"mini_batches": 2},
                       algorithm=PPO, critic=critic)
    ranks = run_script(tmp_path / "two", {"zero_stage": 2, "lr": 0.01}, 2,
                       shape={"micro_batch_tokens": 16, "mini_batches": 2}, algorithm=PPO, critic=critic)
    assert ranks[0]["sha256"] == ranks[1]["sha256"] and ranks[0]["critic_sha256"] == ranks[1]["critic_sha256"]
    for run in (whole[0], *ranks):
        first, second = run["metrics"]
        assert first["critic_updates"] == second["critic_updates"] == 2 and run["untrained"] == [[], []]
        # The head starts at 0: the first step's values are 0, so R = the outcome reward (γ = 1) and
        # nothing varies in V to explain R; after one step V explains part of R. The second update of
        # the first step moved V past ε_v on some tokens: the clip bound (on one machine, 2026-12-03:
        # a quarter of the tokens, and explained variance 0.19).
        assert first["value_mean"] == 0.0 and first["explained_variance"] == pytest.approx(0.0, abs=1e-9)
        assert first["vf_clip_fraction"] > 0.05 and second["explained_variance"] > 0.05
    for key in ("loss", "value_loss", "value_mean", "explained_variance", "grad_norm", "critic_grad_norm"):
        assert [m[key] for m in ranks[0]["metrics"]] == pytest.approx([m[key] for m in whole[0]["metrics"]],
                                                                      rel=1e-5, abs=1e-6), key
    # A count of tokens past the clip bound: one sitting on the bound flips with the rounding that ZeRO-2
    # micro-batches and one pass differ by (a CI run, 2026-12-04: second step 0.0 against 0.125, one token).
    assert [m["vf_clip_fraction"] for m in ranks[0]["metrics"]] == pytest.approx(
        [m["vf_clip_fraction"] for m in whole[0]["metrics"]], abs=0.13)
    for name, value in whole[0]["critic"].items():  # Adam's rounding-noise caveat above: a tenth of a step
        torch.testing.assert_close(torch.tensor(ranks[0]["critic"][name]), torch.tensor(value), atol=1e-3, rtol=0)


def test_the_critic_resumes_from_the_policys_checkpoint(tmp_path: Path):
    """Three steps straight equal two steps, a checkpoint, and one step in a new process that loaded
    it: the critic's weights and Adam state come back with the policy's."""
    engine, critic = {"zero_stage": 0, "lr": 0.01}, {"lr": 0.01}
    straight = run_script(tmp_path / "straight", engine, 1, "--steps", "3", algorithm=PPO, critic=critic)
    ckpt = tmp_path / "ckpt"
    run_script(tmp_path / "first", engine, 1, "--steps", "2", "--resume", str(ckpt), algorithm=PPO,
               critic=critic)
    assert (ckpt / "step-00000002" / "critic").is_dir()
    second = run_script(tmp_path / "second", engine, 1, "--steps", "1", "--resume", str(ckpt),
                        algorithm=PPO, critic=critic)
    assert second[0]["metrics"][0]["value_loss"] == straight[0]["metrics"][2]["value_loss"]
    assert second[0]["losses"] == straight[0]["losses"][2:]
    assert second[0]["critic_sha256"] == straight[0]["critic_sha256"] and second[0]["sha256"] == straight[0]["sha256"]


def test_a_rank_gone_mid_step_stops_the_trainer_instead_of_dead_lettering_the_batch(tmp_path: Path):
    """The step guard dead-letters a batch whose step raised; a failed collective is not the batch's
    doing (runner._guarded_step): the error goes up, and the supervisor restarts the trainer."""
    (found,) = run_script(tmp_path / "gone", {"collective_timeout_s": 5}, 2, "--rank-gone", ranks=1)
    assert found["raised"] == "RuntimeError" and found["collective"], found
