"""Each algorithm preset learns, in process and without a broker: a tiny model answers a prompt with
one token, rewarded 1 when the token is in a fixed quarter of its vocabulary. Each step samples
groups from the current weights (their behaviour log-probs recorded as a rollout worker does), runs
the preset's processors pipeline (the no-broker harness), the trainer's once-per-step pass (an
advantage transform; with a critic, its values), and minimises its trainer objective with Adam (and a
critic's clipped value loss with an Adam of its own). The loss stays finite at every step and the reward rises.
ReMax's samples carry the greedy answer's reward, as the rollout's greedy_baseline gives them; on-policy
distillation learns from a teacher that GRPO trained on the same task first (no reward reaches it)."""

from __future__ import annotations

import pytest
import torch

from undertow.infra.algorithms import presets
from undertow.infra.run.config import RunConfig
from undertow.kernel.models import build_model, weights_to_bytes
from undertow.processors.harness import Harness
from undertow.schemas import Experience
from undertow.trainer.critic import Critic, value_model
from undertow.trainer.objectives import objectives
from undertow.trainer.step import StepShape, prepare_step

PROMPT = [5, 6, 7]
GROUPS, SIZE, STEPS = 4, 8, 15


def sample(model: torch.nn.Module, step: int, rewarded: torch.Tensor, greedy_baseline: bool = False) -> list[Experience]:
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([PROMPT])).logits[0, -1].double(), -1)  # [V]
    metadata = {"baseline_reward": float(rewarded[logp.argmax()])} if greedy_baseline else {}
    out = []
    for g in range(GROUPS):
        for i, token in enumerate(torch.multinomial(logp.exp(), SIZE, replacement=True).tolist()):
            out.append(Experience(
                experience_id=f"{step}/{g}/{i}", task_id=f"t{g}", group_id=f"{step}/{g}", group_size=SIZE,
                sample_index=i, prompt_tokens=PROMPT, response_tokens=[token], behaviour_logprobs=[logp[token].item()],
                reward=float(rewarded[token]), policy_version=step, finish_reason="stop", metadata=metadata))
    return out


def rewarded_tokens(vocab_size: int) -> torch.Tensor:
    rewarded = torch.zeros(vocab_size)
    rewarded[torch.randperm(vocab_size, generator=torch.Generator().manual_seed(1))[:vocab_size // 4]] = 1
    return rewarded


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Weights GRPO trained on the task (a safetensors file), for the distillation preset's teacher."""
    path = tmp_path_factory.mktemp("teacher") / "teacher.safetensors"
    model = learn("grpo", {})[0]
    path.write_bytes(weights_to_bytes(model))
    return str(path)


@pytest.mark.parametrize("name", presets.names())
def test_each_preset_learns_with_a_finite_loss(name, request):
    options = {"teacher": {"init_from": request.getfixturevalue("teacher")}} if name == "on_policy_distill" else {}
    learn(name, options)


def learn(name: str, options: dict) -> tuple[torch.nn.Module, list[float]]:
    """`name`'s preset through STEPS steps of the task: the model, and each step's mean reward."""
    torch.manual_seed(0)
    cfg = RunConfig.model_validate({"algorithm": {"name": name, **options}})
    model, reference = build_model(cfg.model), build_model(cfg.model).eval()
    rewarded = rewarded_tokens(model.config.vocab_size)
    objective = objectives.get(cfg.trainer.algorithm.objective)(cfg.trainer.algorithm)
    harness = Harness(cfg.processors.pipeline)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    critic = None
    if cfg.trainer.critic:  # PPO's value model: its values feed GAE, its value loss trains it beside the policy
        critic = Critic(value_model(cfg.model), aggregation=cfg.trainer.algorithm.aggregation,
                        value_clip=cfg.trainer.critic.value_clip)
        critic_optimizer = torch.optim.Adam(critic.model.parameters(), lr=3e-3)
    rewards = []
    for step in range(STEPS):
        experiences = sample(model, step, rewarded, cfg.rollout.greedy_baseline)
        rewards.append(sum(e.reward for e in experiences) / len(experiences))
        ready = [a.experience for a in harness.feed(experiences).ready]
        if not ready:  # every group dropped (dynamic sampling): nothing to learn from
            continue
        collate = lambda rs: objective.collate(rs, pad_id=0, pad_to_multiple=1)
        ready, _ = prepare_step(objective, ready, reference, StepShape(pad_to_multiple=1), collate, critic)  # as train_step
        batch = collate(ready)
        loss = objective.loss(model, batch, reference, objective.totals(ready)).loss
        assert torch.isfinite(loss), (name, step, loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if critic is not None:
            value_loss = critic.loss(critic.model, batch, None, objective.totals(ready)).loss
            assert torch.isfinite(value_loss), (name, step, value_loss)
            critic_optimizer.zero_grad()
            value_loss.backward()
            critic_optimizer.step()
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last >= first + 0.2, f"{name}: reward {first:.2f} -> {last:.2f} ({[round(r, 2) for r in rewards]})"
    return model, rewards
