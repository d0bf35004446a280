"""The rules between a run's sections: each a function of the whole config that names the fields it
finds in conflict and why, run by RunConfig (infra/run/config.py) for the run and every stage.

A rule that finds nothing yields nothing; `RULES` keeps them in the order their messages are shown.
Each has a test that breaks it (tests/infra/test_config_rules.py counts them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

from undertow.kernel.models.checks import context_length, missing_weights, model_problems
from undertow.processors.api import PROCESSORS
from undertow.processors.pipeline import Pipeline
from undertow.rollout.contamination import shares
from undertow.rollout.engines import engines
from undertow.rollout.feeder.selectors import selectors
from undertow.trainer.objectives import objectives

if TYPE_CHECKING:
    from undertow.infra.run.config import RunConfig

Rule = Callable[["RunConfig"], Iterator[str]]
RULES: dict[str, Rule] = {}
# Rules about how `undertow run` wires its stages together; a component command started on its own
# (e.g. `undertow train` on a namespace `undertow replay` filled) is not bound by them.
WHOLE_RUN: set[str] = set()


def rule(fn: Rule) -> Rule:
    RULES[fn.__name__] = fn
    return fn


def whole_run_rule(fn: Rule) -> Rule:
    WHOLE_RUN.add(fn.__name__)
    return rule(fn)


def problems(config: "RunConfig", *, whole_run: bool = True) -> list[str]:
    """What the rules find wrong with `config`, in rule order; `whole_run=False` (a component command)
    leaves out the rules about how `undertow run` wires the stages."""
    return [message for name, check in RULES.items() if whole_run or name not in WHOLE_RUN
            for message in check(config)]


@rule
def workers_no_staler_than_the_trainer(cfg: "RunConfig") -> Iterator[str]:
    worker, stale = cfg.rollout.max_staleness, cfg.trainer.batching.max_staleness
    if objectives.get(cfg.trainer.algorithm.objective).checks_staleness and worker > stale:
        yield (f"rollout.max_staleness ({worker}) must be <= trainer.batching.max_staleness ({stale}): "
               f"workers would generate what the trainer rejects as stale")


@rule
def sync_every_within_the_staleness_bound(cfg: "RunConfig") -> Iterator[str]:
    """`sync_every > 1` with on-policy (staleness 0) is the deadlock the issue names."""
    every, stale = cfg.trainer.sync_every, cfg.trainer.batching.max_staleness
    if objectives.get(cfg.trainer.algorithm.objective).checks_staleness and every - 1 > stale:
        yield (f"trainer.sync_every ({every}) needs trainer.batching.max_staleness >= {every - 1} (it is {stale}): "
               f"between two published versions every new experience would be too stale to train on, and the "
               f"run would wait for ever")


@rule
def one_sampling_temperature(cfg: "RunConfig") -> Iterator[str]:
    sampled, assumed = cfg.rollout.sampling.temperature, cfg.trainer.algorithm.temperature
    if objectives.get(cfg.trainer.algorithm.objective).importance_sampled and sampled != assumed:
        yield (f"rollout.sampling.temperature ({sampled}) must equal trainer.algorithm.temperature ({assumed}): "
               f"the trainer recomputes log-probs at its temperature, so every importance ratio would be skewed")


@whole_run_rule
def objective_trains_on_what_the_processors_write(cfg: "RunConfig") -> Iterator[str]:
    """The trainer reads only its objective's record type; in a run, experiences.ready holds what
    the processors pipeline writes, so any other type would leave it refusing every record."""
    name = cfg.trainer.algorithm.objective
    wanted, written = objectives.get(name).record_type, Pipeline.emits
    if wanted is not written:
        yield (f"trainer.algorithm.objective ({name}) trains on {wanted.__name__} records, but processors.pipeline "
               f"writes {written.__name__} records to experiences.ready: the trainer would refuse every one. "
               f"Make them from an archive (`undertow replay --shape dpo_pairs`) and run `undertow train` on that "
               f"namespace, or train this run with an objective on {written.__name__} records (rl, sft)")


@rule
def experience_text_kept_for_rl(cfg: "RunConfig") -> Iterator[str]:
    """A processor that rewrites response text (a data-juicer mapper) leaves the tokens and their
    behaviour log-probs as generated: for an importance-sampled objective the text would no longer be
    what was trained, and retokenizing it would break the ratios. Offline objectives may use one."""
    import undertow.processors.builtins  # noqa: F401  registers them: a default pipeline is not validated

    name = cfg.trainer.algorithm.objective
    if not objectives.get(name).importance_sampled:
        return
    for i, entry in enumerate(cfg.processors.pipeline):
        component = PROCESSORS.resolve(entry)
        ask = getattr(component.obj, "text_mappers", None)
        mappers = ask(**component.kwargs) if ask else []
        if mappers:
            yield (f"processors.pipeline.{i} ({component.name}): mapper(s) {mappers} rewrite the response text, but "
                   f"trainer.algorithm.objective ({name}) learns from the generated tokens and their behaviour "
                   f"log-probs, which would no longer match it. Use filters only (they drop, never rewrite), clean "
                   f"the tasks before training (undertow prepare), or an offline objective (sft, dpo, kto, ...)")


@whole_run_rule
def held_out_tasks_are_held_out(cfg: "RunConfig") -> Iterator[str]:
    """Measured on the prompts (rollout/contamination.py), not on the source settings: another seed of
    a small generator draws the same problems."""
    for i, (taskset, share) in enumerate(shares(cfg.eval.tasksets, cfg.eval.max_tasks, cfg.feeder.tasksets)):
        if share > cfg.eval.max_overlap:
            yield (f"eval.tasksets.{i} ({taskset.name}): {share:.0%} of its prompts are ones the feeder's tasksets "
                   f"draw too, above eval.max_overlap ({cfg.eval.max_overlap:g}): its accuracy would not be held out. "
                   f"Split the problems (e.g. arithmetic's split: train / heldout), or set eval.max_overlap: 1.0 "
                   f"to evaluate on training tasks knowingly")


@rule
def adapters_reach_an_engine_that_applies_them(cfg: "RunConfig") -> Iterator[str]:
    lora = cfg.trainer.lora
    if lora is None:
        return
    engine = engines.resolve(cfg.rollout.engine)
    ask = getattr(engine.obj, "adapter_problem", None)
    problem = ask(engine.kwargs, lora.rank) if ask else f"rollout.engine ({engine.name}) does not say it applies them"
    if problem:
        yield f"trainer.lora (rank {lora.rank}) publishes adapter-only weight updates, but {problem}"


@rule
def model_files_exist(cfg: "RunConfig") -> Iterator[str]:
    """Missing model files fail here, before a broker, the children and a model build (seconds later)."""
    yield from model_problems(cfg.model)
    critic = cfg.trainer.critic
    if critic is not None and critic.init_from and (problem := missing_weights(critic.init_from)):
        yield f"trainer.critic.init_from: {problem}"


# Longest response that is never a typo when the model does not say its context (no config key).
MAX_NEW_TOKENS_WITHOUT_CONTEXT = 1 << 20


@rule
def max_new_tokens_fit_the_context(cfg: "RunConfig") -> Iterator[str]:
    """A response as long as the model's context leaves no room for the prompt: every generation fails
    (or, on a model that does not say its context, runs for hours)."""
    asked = {"rollout.sampling.max_new_tokens": cfg.rollout.sampling.max_new_tokens,
             "eval.max_new_tokens": cfg.eval.max_new_tokens}
    context = context_length(cfg.model)
    for field, tokens in asked.items():
        if tokens is None:
            continue
        if context is not None and tokens >= context[0]:
            yield (f"{field} ({tokens}) must be below the model's context ({context[0]} tokens, {context[1]}): "
                   f"prompt and response together never fit")
        elif context is None and tokens > MAX_NEW_TOKENS_WITHOUT_CONTEXT:
            yield (f"{field} ({tokens}) is beyond {MAX_NEW_TOKENS_WITHOUT_CONTEXT} tokens and the model states no "
                   f"context to check it against: set it to what the model can generate")


@whole_run_rule
def pass_rates_have_a_reporter(cfg: "RunConfig") -> Iterator[str]:
    """A selector steered by pass rates reads them from task-stats, which only a stage with
    `task_stats()` (prioritize) writes: without one it would draw blindly for the whole run."""
    selector = cfg.feeder.selector
    if not selectors.resolve(selector).obj.uses_pass_rates:
        return
    if not any(hasattr(PROCESSORS.resolve(entry).obj, "task_stats") for entry in cfg.processors.pipeline):
        name = selector if isinstance(selector, str) else selector.get("name")
        yield (f"feeder.selector ({name}) draws by pass rates, but no stage of processors.pipeline reports them "
               f"(add prioritize): the feeder would never hear of one")


@rule
def stages_compare_log_probs_at_the_sampling_temperature(cfg: "RunConfig") -> Iterator[str]:
    """A stage that sets its log-probs against the student's (distill's teacher) must compute them at the
    temperature the student sampled at, or every token's gap carries the two temperatures' difference."""
    import undertow.processors.builtins  # noqa: F401  registers them: a default pipeline is not validated

    sampled = cfg.rollout.sampling.temperature
    for i, entry in enumerate(cfg.processors.pipeline):
        component = PROCESSORS.resolve(entry)
        ask = getattr(component.obj, "reads_at_temperature", None)
        if ask and (assumed := ask(**component.kwargs)) != sampled:
            yield (f"processors.pipeline.{i} ({component.name}): temperature ({assumed}) must equal "
                   f"rollout.sampling.temperature ({sampled}), the temperature of the student's log-probs it reads")


@rule
def baselines_are_generated(cfg: "RunConfig") -> Iterator[str]:
    """An advantage against the greedy answer's reward (ReMax) reads it from each sample's metadata,
    which only rollout.greedy_baseline puts there: without it every group would be rejected."""
    import undertow.processors.builtins  # noqa: F401  registers them: a default pipeline is not validated

    if cfg.rollout.greedy_baseline:
        return
    for i, entry in enumerate(cfg.processors.pipeline):
        component = PROCESSORS.resolve(entry)
        ask = getattr(component.obj, "reads_baselines", None)
        if ask and ask(**component.kwargs):
            yield (f"processors.pipeline.{i} ({component.name}): its advantage is measured against the reward of "
                   f"each task's greedy answer, which rollout.greedy_baseline (false) does not generate: set it true")


@whole_run_rule
def own_logins_fit_the_cluster(cfg: "RunConfig") -> Iterator[str]:
    """A SCRAM login per component needs a SASL listener; a certificate per component, the run's own
    broker (its CA signs them). The run's own broker gets either."""
    kafka, access = cfg.kafka, cfg.access
    if not (access.per_component and kafka.bootstrap_servers):
        return
    if access.certificates:
        yield (f"access.login certificate needs the run's own broker, whose CA signs each component's certificate: "
               f"remove kafka.bootstrap_servers ({kafka.bootstrap_servers}); on Kubernetes, Strimzi's User Operator "
               f"issues them (`undertow acls --strimzi`)")
    elif not kafka.sasl:
        yield (f"access.per_component needs kafka.security_protocol SASL_PLAINTEXT or SASL_SSL (it is "
               f"{kafka.security_protocol}): each component logs in with a SCRAM-SHA-512 password, and the "
               f"config's login, the operator's, must be a super user of the cluster")
