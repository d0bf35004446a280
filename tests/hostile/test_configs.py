"""Invalid and contradictory configs: every command refuses them before it starts, with exit code 2
and a message that names the field (no broker is needed: nothing may get that far)."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from undertow.infra.cli import app

PLUGIN = "tests.hostile.processor_plugins.RaisesWhenBuilt"

# (command, config, what the error must say): one line per hostile config.
CASES = [
    ("process", {"processors": {"batch_size": 0, "pipeline": 5}}, ["processors.batch_size", "processors.pipeline"]),
    ("process", {"processors": {"surprise": 1}}, ["processors.surprise", "Extra inputs are not permitted"]),
    ("process", {"processors": {"pipeline": ["clean", "tests.hostile.nowhere.fn"]}},
     ["processors.pipeline", "tests.hostile.nowhere.fn", "cannot import"]),
    ("process", {"processors": {"pipeline": [{"name": "clean", "max_tokens": 5}]}},
     ["processors.pipeline", "unexpected argument(s) ['max_tokens']"]),
    ("process", {"processors": {"pipeline": [{"name": PLUGIN, "level": -1}]}},  # the plugin's own check raises
     ["processors.pipeline", "level must be >= 0, got -1"]),
    ("train", {"trainer": {"batching": {"experiences": 8, "token_budget": 512}}},  # contradictory
     ["trainer.batching", "experiences / token_budget: set exactly one"]),
    ("train", {"trainer": {"engine": {"offload_optimizer": True, "zero_stage": 0}}},  # contradictory
     ["trainer.engine", "offload_optimizer: needs zero_stage >= 1"]),
    ("train", {"trainer": {"engine": {"lr": -1}, "algorithm": {"policy_loss": "no_such_loss"}}},
     ["trainer.engine.lr", "greater than 0", "trainer.algorithm.policy_loss", "no_such_loss", "unknown"]),
    ("rollout", {"rollout": {"max_staleness": -1, "reward": "no_such_reward"}},
     ["rollout.max_staleness", "rollout.reward", "no_such_reward"]),
    ("rollout", {"rollout": {"workflow": {"name": "single_turn", "turns": 3}}},
     ["rollout.workflow", "unexpected argument(s) ['turns']"]),
    ("feed", {"feeder": {"max_lag": 0, "tasksets": [{"name": "bad name!", "source": "arithmetic"}]}},
     ["feeder.max_lag", "feeder.tasksets.0.name"]),
    ("run", {"run": {"stages": [{"name": "rl"}], "processor_workers": 0}},
     ["run.stages.0.steps", "Field required", "run.processor_workers"]),
    ("run", {"trainer": {"engine": {"lr": 0.1}}, "run": {"stages": [{"name": "rl", "steps": 2,
                                                                       "trainer": {"engine": {"lr": -1}}}]}},
     ["run.stages.0 (rl)", "trainer.engine.lr"]),  # valid on its own, invalid once the stage applies
    ("run", {"rollout": {"reward": "no_such_reward"}}, ["rollout.reward", "no_such_reward"]),
    ("run", {"rollout": {"max_staleness": 3}, "trainer": {"batching": {"max_staleness": 1}}},  # contradictory
     ["rollout.max_staleness (3) must be <= trainer.batching.max_staleness (1)"]),
    ("run", {"namespace": "bad ns!"}, ["namespace", "should match pattern"]),
    ("run", {"rollout": {"sampling": {"temperature": 0.7}}},  # contradictory: skews every importance ratio
     ["rollout.sampling.temperature (0.7) must equal trainer.algorithm.temperature (1.0)"]),
    ("run", {"rollout": {"max_staleness": 0}, "trainer": {"sync_every": 4, "batching": {"max_staleness": 0}}},
     ["trainer.sync_every (4) needs trainer.batching.max_staleness >= 3 (it is 0)", "wait for ever"]),  # deadlock
    ("run", {"processors": {"pipeline": ["clean", {"name": "reshape", "advantage": "grpoo"}]}},
     ["processors.pipeline", "advantage estimator 'grpoo': unknown"]),
    ("run", {"run": {"stages": [{"name": "rl", "steps": 2, "processors": {"pipeline": ["clen"]}}]}},
     ["run.stages.0 (rl)", "processors.pipeline", "processor 'clen': unknown"]),
    ("process", {"processors": {"pipeline": [{"name": "clean", "min_response_tokens": 9,  # contradictory
                                              "max_response_tokens": 4}]}},
     ["processors.pipeline", "min_response_tokens 9 > max_response_tokens 4"]),
    ("train", {"namespace": "bad ns!"}, ["namespace", "should match pattern"]),
    ("train", {"trainer": {"batching": {"experiences": 4}, "mini_batches": 8}},  # an update with no records
     ["trainer", "mini_batches: 8 updates cannot split a batch of 4 experiences"]),
    ("train", {"trainer": {"engine": {"schedule": {"name": "cosine"}}}},
     ["trainer.engine.schedule", "total_steps: the cosine schedule decays to 0 at total_steps"]),
    ("train", {"trainer": {"lora": {"rank": 0, "dropout": 1.5}}}, ["trainer.lora.rank", "trainer.lora.dropout"]),
    ("run", {"trainer": {"lora": {}}, "rollout": {"engine": {"name": "vllm"}}},
     ["trainer.lora (rank 8) publishes adapter-only weight updates", "rollout.engine.max_lora_rank >= 8"]),
    ("run", {"trainer": {"lora": {"rank": 16}}, "rollout": {"engine": {"name": "vllm", "max_lora_rank": 8}}},
     ["rollout.engine.max_lora_rank >= 16"]),
    ("rollout", {"rollout": {"engine": {"name": "vllm"}, "sampling": {"top_p": 0.9}}},  # log-probs over the nucleus
     ["rollout.sampling.top_p (0.9) must be 1 with the vllm engine"]),
    ("run", {"rollout": {"engine": "vllm", "sampling": {"top_p": 0.95}}}, ["rollout.sampling.top_p (0.95)"]),
    ("run", {"feeder": {"tasksets": [{"name": "s", "source": {"name": "sums", "size": 10}}]},
             "eval": {"tasksets": [{"name": "held", "source": {"name": "sums", "size": 10}}]}},  # not held out
     ["eval.tasksets.0 (held): 100% of its prompts are ones the feeder's tasksets draw too"]),
    ("eval", {"eval": {"tasksets": []}}, ["eval.tasksets: the config names no held-out taskset"]),
    ("eval", {"eval": {"greedy": False, "tasksets": [{"name": "h", "source": "sums"}]}},
     ["eval", "samples: with greedy: false, samples must be >= 1"]),
    ("watch", {"watchers": ["response_length", "no_such_watcher"]}, ["watchers.1", "no_such_watcher", "unknown"]),
    ("run", {"watchers": ["stale_fraction", {"name": "entropy_collapse", "windw": 3}]},
     ["watchers.1", "unexpected argument(s) ['windw']"]),
    ("run", {"watchers": [{"name": "response_length", "factor": 0.5}]}, ["watchers.0", "factor > 1"]),  # its own check
    ("watch", {"watchers": ["json.dumps"]}, ["watchers.0", "`reads` must list some of"]),  # no topics to read
    ("watch", {"watchers": ["response_length", "response_length"]}, ["watchers.1", "configured twice"]),
    ("watch", {"watchers": []}, ["watchers is empty"]),
]


def invoke(tmp_path, command: str, text: str) -> tuple[int, str]:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    args = [command, str(path), *(["-b", "localhost:1"] if command in ("rollout", "feed") else [])]
    result = CliRunner().invoke(app, args)
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines


@pytest.mark.parametrize("command, config, says", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_bad_config_is_refused_naming_the_field(tmp_path, command, config, says):
    code, output = invoke(tmp_path, command, yaml.safe_dump(config))
    assert code == 2, output
    assert output.startswith("error:"), output  # one clear line, not a traceback
    for words in says:
        assert words in output, (words, output)


@pytest.mark.parametrize("command", ["process", "train", "rollout", "feed", "run"])
def test_a_file_that_is_no_config_is_refused(tmp_path, command):
    code, output = invoke(tmp_path, command, "trainer: [unclosed\n")
    assert code == 2 and "cannot read config" in output, output
    code, output = invoke(tmp_path, command, "- a list\n- not a mapping\n")
    assert code == 2 and "expected a mapping at the top level" in output, output
