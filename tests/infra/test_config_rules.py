"""The rules between sections (infra/run/rules.py), each broken once through `undertow config
check`: exit 2, naming the fields in conflict; and a neighbouring config that keeps the rule passes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from undertow.infra.cli import app
from undertow.infra.run.rules import RULES
from tests.helpers import write_config

ON_POLICY = {"rollout": {"max_staleness": 0}, "trainer": {"batching": {"max_staleness": 0}}}

# rule name: (config that breaks it, what the error says, a config beside it that keeps it)
CASES = {
    "workers_no_staler_than_the_trainer": (
        {"rollout": {"max_staleness": 3}, "trainer": {"batching": {"max_staleness": 1}}},
        ["rollout.max_staleness (3) must be <= trainer.batching.max_staleness (1)"],
        {"rollout": {"max_staleness": 1}, "trainer": {"batching": {"max_staleness": 1}}}),
    "sync_every_within_the_staleness_bound": (  # on-policy with a version every 2 steps: a deadlock
        {**ON_POLICY, "trainer": {"sync_every": 2, "batching": {"max_staleness": 0}}},
        ["trainer.sync_every (2) needs trainer.batching.max_staleness >= 1 (it is 0)"],
        {**ON_POLICY, "trainer": {"sync_every": 1, "batching": {"max_staleness": 0}}}),
    "one_sampling_temperature": (
        {"rollout": {"sampling": {"temperature": 0.7}}},
        ["rollout.sampling.temperature (0.7) must equal trainer.algorithm.temperature (1.0)"],
        {"rollout": {"sampling": {"temperature": 0.7}}, "trainer": {"algorithm": {"temperature": 0.7}}}),
    "objective_trains_on_what_the_processors_write": (
        {"trainer": {"algorithm": {"objective": "dpo"}}},
        ["trainer.algorithm.objective (dpo) trains on PreferencePair records",
         "processors.pipeline writes Experience records"],
        {"trainer": {"algorithm": {"objective": "sft"}}}),
    "experience_text_kept_for_rl": (  # a mapper on experiences: the text would no longer be the tokens trained
        {"processors": {"pipeline": ["clean", {"name": "data_juicer", "ops": [
            {"text_length_filter": {"min_len": 1}}, {"whitespace_normalization_mapper": {}}]}, "reshape"]}},
        ["processors.pipeline.1 (data_juicer): mapper(s) ['whitespace_normalization_mapper']",
         "trainer.algorithm.objective (rl) learns from the generated tokens", "undertow prepare"],
        {"processors": {"pipeline": ["clean", {"name": "data_juicer", "ops": [
            {"whitespace_normalization_mapper": {}}]}, "reshape"]}, "trainer": {"algorithm": {"objective": "sft"}}}),
    "held_out_tasks_are_held_out": (  # another seed of a small generator: the same 100 sums
        {"feeder": {"tasksets": [{"name": "s", "source": {"name": "sums", "size": 1000}}]},
         "eval": {"tasksets": [{"name": "held", "source": {"name": "sums", "size": 10, "seed": 1}}]}},
        ["eval.tasksets.0 (held): 100% of its prompts are ones the feeder's tasksets draw too",
         "above eval.max_overlap (0.01)", "eval.max_overlap: 1.0"],
        {"feeder": {"tasksets": [{"name": "s", "source": {"name": "sums", "size": 1000}}]},
         "eval": {"tasksets": [{"name": "held", "source": {"name": "sums", "size": 10, "seed": 1}}], "max_overlap": 1.0}}),
    "adapters_reach_an_engine_that_applies_them": (
        {"trainer": {"lora": {"rank": 16}}, "rollout": {"engine": {"name": "vllm", "max_lora_rank": 8}}},
        ["trainer.lora (rank 16)", "rollout.engine.max_lora_rank >= 16"],
        {"trainer": {"lora": {"rank": 16}}, "rollout": {"engine": {"name": "vllm", "max_lora_rank": 16}}}),
    "model_files_exist": (  # none of these paths exists; the neighbour names the ones this test makes
        {"model": {"source": "hf", "path": "/nonexistent/smollm2", "init_from": "/nonexistent/hf"},
         "trainer": {"algorithm": {"advantage_transform": "gae"},
                     "critic": {"init_from": "/nonexistent/critic.safetensors"}}},
        ["model.path (/nonexistent/smollm2) does not exist", "model.init_from: /nonexistent/hf does not exist",
         "trainer.critic.init_from: /nonexistent/critic.safetensors does not exist"],
        {"model": {"source": "hf", "path": "{hf}", "init_from": "{hf}"},
         "trainer": {"algorithm": {"advantage_transform": "gae"},
                     "critic": {"init_from": "{hf}/model.safetensors"}}}),
    "max_new_tokens_fit_the_context": (  # the tiny model's context is model.tiny.n_positions (256 by default)
        {"rollout": {"sampling": {"max_new_tokens": 256}}, "eval": {"max_new_tokens": 300}},
        ["rollout.sampling.max_new_tokens (256) must be below the model's context (256 tokens, "
         "model.tiny.n_positions)", "eval.max_new_tokens (300) must be below"],
        {"rollout": {"sampling": {"max_new_tokens": 200}}, "eval": {"max_new_tokens": 255}}),
    "pass_rates_have_a_reporter": (
        {"feeder": {"selector": "bots"}, "processors": {"pipeline": ["clean", "reshape"]}},
        ["feeder.selector (bots) draws by pass rates", "no stage of processors.pipeline reports them"],
        {"feeder": {"selector": "bots"}, "processors": {"pipeline": ["clean", "reshape", "prioritize"]}}),
    "stages_compare_log_probs_at_the_sampling_temperature": (
        {"rollout": {"sampling": {"temperature": 0.7}}, "trainer": {"algorithm": {"temperature": 0.7}},
         "processors": {"pipeline": ["clean", {"name": "distill", "teacher": {}}]}},
        ["processors.pipeline.1 (distill): temperature (1.0) must equal rollout.sampling.temperature (0.7)"],
        {"rollout": {"sampling": {"temperature": 0.7}}, "trainer": {"algorithm": {"temperature": 0.7}},
         "processors": {"pipeline": ["clean", {"name": "distill", "teacher": {}, "temperature": 0.7}]}}),
    "baselines_are_generated": (
        {"processors": {"pipeline": ["clean", {"name": "reshape", "advantage": "remax"}]}},
        ["processors.pipeline.1 (reshape): its advantage is measured against the reward of each task's greedy answer",
         "rollout.greedy_baseline (false)"],
        {"processors": {"pipeline": ["clean", {"name": "reshape", "advantage": "remax"}]},
         "rollout": {"greedy_baseline": True}}),
    "own_logins_fit_the_cluster": (
        {"kafka": {"bootstrap_servers": "127.0.0.1:9"}, "access": {"per_component": True}},
        ["access.per_component needs kafka.security_protocol SASL_PLAINTEXT or SASL_SSL (it is PLAINTEXT)"],
        {"kafka": {"bootstrap_servers": "127.0.0.1:9", "security_protocol": "SASL_PLAINTEXT", "sasl_username": "op",
                   "sasl_password": "op-secret"}, "access": {"per_component": True}}),
}


def check(tmp_path: Path, sections: dict) -> tuple[int, str]:
    path = write_config(tmp_path / "run.yaml", "lab", **sections)
    result = CliRunner().invoke(app, ["config", "check", str(path)])
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines


def test_every_rule_is_broken_here():
    assert list(CASES) == list(RULES)  # a rule added to infra/run/rules.py needs its case here


@pytest.mark.parametrize("rule", list(CASES))
def test_a_config_that_breaks_the_rule_fails_naming_the_fields(tmp_path, rule):
    broken, says, kept = CASES[rule]
    if "{hf}" in str(kept):  # the files the rule looks for (it reads headers, never weights)
        (tmp_path / "hf").mkdir()
        (tmp_path / "hf" / "config.json").write_text('{"n_positions": 256}')
        (tmp_path / "hf" / "model.safetensors").write_bytes(b"")
        kept = yaml.safe_load(yaml.safe_dump(kept).replace("{hf}", str(tmp_path / "hf")))
    code, output = check(tmp_path, broken)
    assert code == 2 and output.startswith("error:"), output
    for words in says:
        assert words in output, (words, output)
    code, output = check(tmp_path, kept)
    assert code == 0 and output.startswith("ok "), output


def test_a_certificate_per_component_needs_the_runs_own_broker(tmp_path):
    """Its CA signs them: a cluster of the user's (even over SASL) cannot take them from the run."""
    cluster = {"bootstrap_servers": "127.0.0.1:9", "security_protocol": "SASL_PLAINTEXT", "sasl_username": "op",
               "sasl_password": "op-secret"}
    code, output = check(tmp_path, {"kafka": cluster, "access": {"per_component": True, "login": "certificate"}})
    assert code == 2 and "access.login certificate needs the run's own broker" in output, output
    assert check(tmp_path, {"access": {"per_component": True, "login": "certificate"}})[0] == 0


def test_a_stage_that_breaks_a_rule_fails_naming_the_stage(tmp_path):
    """The rules hold for every stage's merged config: a DPO stage in a run would starve."""
    stages = [{"name": "warmup", "steps": 2, "trainer": {"algorithm": {"objective": "sft"}}},
              {"name": "pairs", "steps": 2, "trainer": {"algorithm": {"objective": "dpo"}}}]
    code, output = check(tmp_path, {"run": {"stages": stages}})
    assert code == 2 and "run.stages.1 (pairs)" in output and "objective (dpo)" in output, output


def test_a_component_command_keeps_every_rule_but_the_whole_runs(tmp_path):
    """`undertow train` on a namespace `undertow replay --shape dpo_pairs` filled is how DPO runs: the
    objective rule is about what `undertow run` wires, so a component command is not bound by it, nor
    by the contamination rule (`undertow eval` reports the figure; the run refuses to start on it);
    the rules about one stage's processes (here the temperatures) bind it like the run."""
    from undertow.kernel.config_io import ConfigError
    from undertow.infra.run.rules import WHOLE_RUN
    from undertow.infra.run.config import load_component_config

    assert WHOLE_RUN == {"objective_trains_on_what_the_processors_write", "held_out_tasks_are_held_out",
                         "pass_rates_have_a_reporter",  # a feeder alone may read another pipeline's reports
                         "own_logins_fit_the_cluster"}  # logins are made by `undertow run`; a component uses the one it has
    dpo = write_config(tmp_path / "dpo.yaml", "lab", trainer={"algorithm": {"objective": "dpo"}})
    assert load_component_config(dpo).trainer.algorithm.objective == "dpo"
    assert check(tmp_path, {"trainer": {"algorithm": {"objective": "dpo"}}})[0] == 2
    hot = write_config(tmp_path / "hot.yaml", "lab", rollout={"sampling": {"temperature": 0.7}})
    with pytest.raises(ConfigError, match=r"rollout.sampling.temperature \(0.7\) must equal"):
        load_component_config(hot)
