"""Algorithm presets (infra/algorithms/): each one a valid run file that sets both sides, the file's
own settings over it, and the listing `undertow algorithms` prints."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from undertow.infra.algorithms import presets
from undertow.infra.cli import app
from undertow.infra.run.config import RunConfig, load_run_config
from undertow.kernel.config_io import ConfigError
from undertow.processors.advantages import ADVANTAGES
from undertow.trainer.algorithms import aggregations, policy_losses
from tests.helpers import write_config

BUILT_IN = ["asymre", "cispo", "clip_cov", "dapo", "dppo", "dr_grpo", "gmpo", "gpg", "grpo", "gspo", "kl_cov",
            "on_policy_distill", "opmd", "opo", "pass_k", "ppo", "reinforce", "reinforce_pp", "reinforce_pp_baseline",
            "remax", "rloo", "sapo"]
NEEDS = {"on_policy_distill": {"teacher": {"seed": 1}}}  # options without a default


def reshape_of(cfg: RunConfig) -> dict:
    return next(e for e in cfg.processors.pipeline if isinstance(e, dict) and e.get("name") == "reshape")


def name_of(entry) -> str:
    return entry if isinstance(entry, str) else entry["name"]


def test_the_built_in_presets():
    assert presets.names() == BUILT_IN


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_preset_sets_the_advantage_and_the_loss_of_a_valid_run(name):
    options = NEEDS.get(name, {})
    cfg = RunConfig.model_validate({"algorithm": {"name": name, **options}})
    algo = cfg.trainer.algorithm
    assert algo.objective == "rl" and algo.policy_loss == presets.get(name)(**options)["trainer"]["algorithm"]["policy_loss"]
    stages = [name_of(e) for e in cfg.processors.pipeline]
    assert "reshape" in stages or "distill" in stages  # what writes the advantages
    if "reshape" in stages:
        assert name_of(reshape_of(cfg)["advantage"]) in ADVANTAGES.names()
    assert name_of(algo.policy_loss) in policy_losses.names() and name_of(algo.aggregation) in aggregations.names()


def test_what_the_file_sets_overrides_the_preset():
    cfg = RunConfig.model_validate({"algorithm": "dapo", "trainer": {
        "algorithm": {"policy_loss": {"name": "dapo", "eps_high": 0.3}, "kl": {"coef": 0.01}}}})
    assert cfg.trainer.algorithm.policy_loss == {"name": "dapo", "eps_low": 0.2, "eps_high": 0.3, "dual_clip": 3.0}
    assert cfg.trainer.algorithm.kl.coef == 0.01 and cfg.trainer.algorithm.aggregation == "token_mean"
    assert reshape_of(cfg)["dynamic_sampling"] is True
    # Another loss replaces the preset's whole, its arguments too (gspo takes no dual_clip).
    cfg = RunConfig.model_validate({"algorithm": "dapo", "trainer": {"algorithm": {"policy_loss": {"name": "gspo"}}}})
    assert cfg.trainer.algorithm.policy_loss == {"name": "gspo"}


def test_a_preset_takes_options_and_an_on_policy_one_sets_staleness_on_both_sides():
    cfg = RunConfig.model_validate({"algorithm": {"name": "grpo", "kl_coef": 0.0, "eps": 0.1}})
    assert cfg.trainer.algorithm.kl.coef == 0.0 and cfg.trainer.algorithm.policy_loss["eps"] == 0.1
    opo = RunConfig.model_validate({"algorithm": "opo"})
    assert opo.trainer.batching.max_staleness == 0 and opo.rollout.max_staleness == 0


def test_ppo_sets_a_critic_and_gae_and_a_file_may_tune_them():
    cfg = RunConfig.model_validate({"algorithm": {"name": "ppo", "lam": 1.0}, "trainer": {"critic": {"lr": 3e-5}}})
    algo = cfg.trainer.algorithm
    assert algo.advantage_transform == {"name": "gae", "gamma": 1.0, "lam": 1.0}
    assert algo.kl.placement == "reward" and algo.kl.estimator == "k1" and algo.kl.coef == 0.02
    assert cfg.trainer.critic.lr == 3e-5 and cfg.trainer.critic.value_clip == 0.2
    # Another transform leaves the preset's critic with nothing to read: the error names the field.
    with pytest.raises(ValueError, match="critic: nothing reads the critic's values"):
        RunConfig.model_validate({"algorithm": "ppo", "trainer": {"algorithm": {"advantage_transform": "batch_whiten"}}})


def test_gpg_drops_groups_without_signal_or_scales_as_verl_does():
    paper = RunConfig.model_validate({"algorithm": "gpg"})
    assert reshape_of(paper)["dynamic_sampling"] is True and paper.trainer.algorithm.advantage_transform is None
    verl = RunConfig.model_validate({"algorithm": {"name": "gpg", "verl_alpha": True}})
    assert "dynamic_sampling" not in reshape_of(verl) and verl.trainer.algorithm.advantage_transform == "gpg"


def test_on_policy_distillation_needs_its_teacher_and_may_keep_the_reward():
    with pytest.raises(ValueError, match="teacher: set the teacher model"):
        RunConfig.model_validate({"algorithm": "on_policy_distill"})
    cfg = RunConfig.model_validate({"algorithm": {"name": "on_policy_distill", "teacher": {"seed": 1}, "with_reward": True}})
    assert [name_of(e) for e in cfg.processors.pipeline] == ["clean", "reshape", "distill", "prioritize"]
    assert cfg.processors.pipeline[2]["mode"] == "add"


def test_a_stage_keeps_its_own_settings_over_the_preset(tmp_path):
    stages = [{"name": "warmup", "steps": 2, "processors": {"pipeline": ["clean"]},
               "trainer": {"algorithm": {"objective": "sft"}}}, {"name": "rl", "steps": 2}]
    path = write_config(tmp_path / "run.yaml", "lab", algorithm="gspo", run={"stages": stages})
    result = CliRunner().invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 0, result.output
    warmup, rl = result.output.split("# stage rl")
    assert "objective: sft" in warmup and "name: reshape" not in warmup
    assert "name: gspo" in rl and "advantage: grpo" in rl
    assert load_run_config(path)[0].trainer.algorithm.policy_loss["name"] == "gspo"


def test_an_unknown_preset_names_the_field_and_the_nearest_one(tmp_path):
    path = write_config(tmp_path / "run.yaml", "lab", algorithm="grpoo")
    with pytest.raises(ConfigError, match=r"algorithm: algorithm 'grpoo': unknown \(did you mean 'grpo'\?\)"):
        load_run_config(path)


def my_preset(*, coef: float = 0.5) -> dict:
    """A user's preset: REINFORCE with an entropy bonus."""
    return {"processors": {"pipeline": ["clean", {"name": "reshape", "advantage": "rloo"}]},
            "trainer": {"algorithm": {"policy_loss": "reinforce", "entropy_coef": coef}}}


def test_a_users_preset_by_dotted_path():
    cfg = RunConfig.model_validate({"algorithm": {"name": f"{__name__}.my_preset", "coef": 0.25}})
    assert cfg.trainer.algorithm.entropy_coef == 0.25 and reshape_of(cfg)["advantage"] == "rloo"


def test_undertow_algorithms_lists_each_preset_with_what_it_sets():
    result = CliRunner().invoke(app, ["algorithms"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for name in BUILT_IN:
        assert any(line.startswith(f"{name}(") for line in lines), name
    assert "opo(): OPO: On-Policy RL with Optimal reward baseline (Hao et al. 2025, eq. 5-6)." in lines
    assert "    rollout.max_staleness: 0" in lines[lines.index(next(l for l in lines if l.startswith("opo("))):]
    assert "    trainer.algorithm.policy_loss: {'name': 'gmpo', 'eps_low': 0.4, 'eps_high': 0.4}" in lines
    blocks = {line.split(" (")[0]: line.split(": ", 1)[1].split(", ") for line in lines if not line.startswith(" ")
              and "(" in line and not line.split("(")[0] in BUILT_IN}
    assert blocks["policy losses"] == policy_losses.names() and "dro" in blocks["policy losses"]
    assert blocks["aggregations"] == aggregations.names() and "token_sum" in blocks["aggregations"]
    assert "abs" in blocks["KL estimators"] and "gae" in blocks["advantage transforms"]
    assert "grpo" in blocks["advantages"]
