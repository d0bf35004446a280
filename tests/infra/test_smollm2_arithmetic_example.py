"""examples/smollm2_arithmetic.yaml (benchmarks/smollm2_learning.py's run) is valid and builds what it
names, without loading the model: every command's section, the tasksets, reward, pipeline, engine and
LoRA; the held-out set is >= 200 different problems none of which training can draw."""

from pathlib import Path

from undertow.infra.run.config import load_component_config, load_run_config, stage_mapping
from undertow.kernel.models.sources import model_sources
from undertow.processors.config import ProcessorsConfig
from undertow.processors.pipeline import Pipeline
from undertow.rollout.engines.base import engines
from undertow.rollout.evaluation import load_heldout
from undertow.rollout.feeder import load_items
from undertow.rollout.rewards import build_reward, total
from undertow.schemas import Task
from undertow.trainer.engine import deepspeed_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2_arithmetic.yaml"


def test_every_command_reads_its_section():
    config, raw = load_run_config(EXAMPLE)
    assert config.model.source == "gguf" and config.run.steps
    assert load_component_config(EXAMPLE) == config  # what every component command reads
    model_sources.get(config.model.source).check(config.model)
    assert engines.resolve(config.rollout.engine).name == "transformers"
    pipeline = Pipeline.from_config(ProcessorsConfig.model_validate(stage_mapping(raw, None)["processors"]).pipeline)
    assert len(pipeline.stages) == 2
    trainer = config.trainer
    assert trainer.lora is not None and trainer.algorithm.temperature == config.rollout.sampling.temperature
    assert deepspeed_config(trainer.engine, world_size=1)["train_micro_batch_size_per_gpu"] >= 1


def test_heldout_is_200_problems_training_never_draws():
    config, _ = load_run_config(EXAMPLE)
    heldout = load_heldout(config.eval.tasksets[0], config.eval.max_tasks)
    prompts = {t.prompt for t in heldout.tasks}
    assert len(heldout.tasks) >= 200 and len(prompts) == len(heldout.tasks)
    train = load_items(config.feeder.tasksets[0].source)
    assert not prompts & {i.prompt for i in train}
    assert config.eval.samples >= 4  # pass@4


def test_reward_scores_a_bare_number_and_the_models_usual_equation():
    config, _ = load_run_config(EXAMPLE)
    reward = build_reward(config.rollout.reward)
    task = Task(task_id="t", prompt="What is 12 + 7? Answer with the number only.", answer="19")
    assert total(reward("19", task)) == 1.0
    assert total(reward("12 + 7 = 19", task)) == 1.0  # the last number is the answer
    assert total(reward("12 + 7 = 21", task)) == 0.0
