"""Tool-using and multi-turn workflows without a broker: a real tiny model that replays a tool-using
conversation (scripted_model.py), the real sandbox, the frozen_lake game; token-in / token-out."""

from __future__ import annotations

import pytest

from undertow.kernel.models import ModelSpec
from undertow.kernel.models.tiny import char_tokenizer
from undertow.schemas import Task
from undertow.rollout.engines import SamplingParams, build_engine
from undertow.rollout.experiences import to_experiences
from undertow.rollout.rewards import build_reward
from undertow.rollout.tools import resolve_tools
from undertow.rollout.tools.chat import tool_prompt
from undertow.rollout.environments.frozen_lake import FrozenLake, draw_grid, shortest_path
from undertow.rollout.workflows import WorkflowContext, build_batch_workflow

from tests.rollout.scripted_model import ANSWER, QUESTION, RESPONSES, SPEC, TIMEOUT_S, TOOLS


class Recorder:
    """The real engine, with every sample it returns kept (to compare with what the workflow recorded)."""

    def __init__(self, engine, stamp_versions: bool = False):
        self.engine, self.tokenizer, self.max_length = engine, engine.tokenizer, engine.max_length
        self.stamp_versions = stamp_versions  # as an engine that swaps weights between turns: turn i is version i
        self.calls: list[int] = []
        self.samples: list = []
        self.scored = 0  # scoring passes asked of the engine

    def generate(self, prompts, n, params):
        self.calls.append(len(prompts) * n)
        out = self.engine.generate(prompts, n, params)
        if self.stamp_versions:
            for group in out:
                for sample in group:
                    sample.versions = [len(self.calls) - 1] * len(sample.tokens)
        self.samples += [s for group in out for s in group]
        return out

    def logprobs(self, prompt, continuation, temperature):
        self.scored += 1
        return self.engine.logprobs(prompt, continuation, temperature)


def play(weights, tasks: list[Task], stamp_versions: bool = False):
    """The scripted tool conversation for `tasks` through the real engine and sandbox."""
    engine = Recorder(build_engine("transformers", SPEC.model_copy(update={"init_from": str(weights)})),
                      stamp_versions)
    ctx = WorkflowContext(engine=engine, sampling=SamplingParams(greedy=True, max_new_tokens=60),
                          reward=build_reward("numeric_match"))
    flow = build_batch_workflow({"name": "tool_agent", "tools": TOOLS, "parser": "pythonic", "timeout_s": TIMEOUT_S,
                                 "max_turns": 6})
    return engine, tasks, flow(tasks, ctx)


@pytest.fixture(scope="module")
def scripted(scripted_weights):
    return play(scripted_weights, [Task(task_id="c1", prompt=QUESTION, answer=ANSWER, group_size=2),
                                   Task(task_id="c2", prompt=QUESTION, answer=ANSWER, group_size=1)])


def test_tool_episodes_of_a_batch_share_each_turn_and_count_tool_outcomes(scripted):
    engine, tasks, outcomes = scripted
    assert engine.calls == [3, 3, 3, 3]  # three episodes, four turns: one engine call per turn
    for t in [t for o in outcomes for t in o]:
        assert t.metadata == {"turns": 4, "tools": {"ok": 1, "timeout": 1, "unknown_tool": 1}}
        assert t.reward_components == {"correct": 1.0} and t.finish_reason == "stop"
        assert "tool: 373216833\n" in t.response_text and "error: hang timed out after 1 s" in t.response_text


def test_masks_are_one_exactly_on_the_engines_tokens(scripted):
    engine, tasks, outcomes = scripted
    tok = engine.tokenizer
    exps = to_experiences(tasks[0], outcomes[0], policy_version=0, worker="w")
    for e in exps:
        policy = [t for t, m in zip(e.response_tokens, e.loss_mask) if m == 1]
        assert tok.decode(policy) == "<eos>".join(RESPONSES) + "<eos>"
        observed = tok.decode([t for t, m in zip(e.response_tokens, e.loss_mask) if m == 0])
        assert observed.count("\ntool: ") == 3 and observed.count("\nassistant: ") == 3
        assert len(e.behaviour_logprobs) == len(e.response_tokens)


def test_token_in_token_out(scripted):
    engine, tasks, outcomes = scripted
    tok = engine.tokenizer
    t = outcomes[0][0]
    # The recorded policy tokens, turn by turn, are the engine's samples exactly (episode 0 is every
    # third sample: the three episodes share each call).
    runs, current = [], []
    for token, m in zip(t.response_tokens, t.loss_mask):
        if m == 1:
            current.append(token)
        elif current:
            runs, current = runs + [current], []
    runs.append(current)
    assert runs == [s.tokens for s in engine.samples[0::3]]
    # Re-tokenizing the decoded conversation would not give them back: the decoded text has lost the
    # four EOS tokens the model generated, so every later token would sit at another position.
    again = tok(t.response_text, add_special_tokens=False)["input_ids"]
    assert len(t.response_tokens) - len(again) == 4 and again != t.response_tokens


def test_behaviour_logprobs_are_the_sampled_ones_with_no_scoring_pass(scripted):
    """Each policy token's log-prob is the one it was sampled with, kept turn by turn: checked against a
    plain forward pass of the model over the whole episode (temperature 1). No scoring pass over
    finished episodes (on vLLM it asks for the whole vocabulary at every position: a SmolLM2 batch of 32
    tool episodes never finished it)."""
    import torch

    engine, tasks, outcomes = scripted
    assert engine.scored == 0
    for t in (outcomes[0][0], outcomes[1][0]):
        ids = torch.tensor([t.prompt_tokens + t.response_tokens])
        with torch.no_grad():
            lp = torch.log_softmax(engine.engine.model(ids).logits[0].double(), -1)
        start = len(t.prompt_tokens) - 1  # position i predicts token i + 1
        expected = [lp[start + i, token].item() for i, token in enumerate(t.response_tokens)]
        assert len(t.logprobs) == len(t.response_tokens) == len(t.loss_mask)
        policy = [(got, want) for got, want, m in zip(t.logprobs, expected, t.loss_mask) if m == 1]
        assert len(policy) > 20 and max(abs(got - want) for got, want in policy) < 1e-4
        assert all(got == 0.0 for got, m in zip(t.logprobs, t.loss_mask) if m == 0)  # never read: mask 0


def test_each_turn_keeps_the_version_that_sampled_it(scripted_weights):
    """Turns sampled under versions 0, 1, 2, 3 (an engine swapping weights between turns) keep them;
    an observation carries the version of the turn before it, so the experience's policy version is
    the oldest sampled one."""
    _, tasks, outcomes = play(scripted_weights, [Task(task_id="v", prompt=QUESTION, answer=ANSWER, group_size=1)],
                              stamp_versions=True)
    (t,) = outcomes[0]
    assert len(t.versions) == len(t.response_tokens)
    turns, previous = [], None
    for version, m in zip(t.versions, t.loss_mask):
        if m == 1 and version != previous:
            turns.append(version)
        elif m == 0:
            assert version == previous  # an observation: the turn's before it
        previous = version
    assert turns == [0, 1, 2, 3]
    (e,) = to_experiences(tasks[0], outcomes[0], policy_version=5, worker="w")
    assert e.policy_version == 0 and e.token_versions == t.versions


def test_retokenizing_merges_what_a_bpe_model_sampled_apart():
    """The other way re-tokenizing goes wrong: a model may sample "4" then "8", text reads "48", and
    BPE gives one token back. A BPE with the single merge 4 8 -> 48, built here."""
    from tokenizers import Tokenizer, decoders, models

    bpe = Tokenizer(models.BPE(vocab={"4": 0, "8": 1, "48": 2}, merges=[("4", "8")]))
    bpe.decoder = decoders.Fuse()
    sampled = [0, 1]  # "4", "8": two steps of generation
    assert bpe.decode(sampled) == "48" and bpe.encode("48").ids == [2] != sampled


def test_template_that_renders_tools_gets_them():
    tok = char_tokenizer()
    tok.chat_template = ("{% if tools %}tools: {% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}"
                         + tok.chat_template)
    text = tool_prompt(tok, [{"role": "user", "content": "hi"}], resolve_tools(["calculator"]), "hermes")
    assert text == "tools: calculator user: hi\nassistant: "  # (HF's Jinja trims the newline after a block)
    plain = tool_prompt(char_tokenizer(), [{"role": "user", "content": "hi"}], resolve_tools(["calculator"]), "hermes")
    assert plain.startswith("system: Tools: calculator(expression: string) - Evaluate") and "<tool_call>" in plain


def test_frozen_lake_hand_worked():
    env = FrozenLake()
    first = env.reset(Task(task_id="f", prompt="Go.", metadata={"grid": ["SF", "HG"]}))
    assert first == "Go.\nPF\nHG"
    assert (env.step("left").observation, env.step("up").done) == ("PF\nHG", False)  # walls: stay put
    assert env.step("I go right").observation == "SP\nHG"
    result = env.step("down")
    assert (result.observation, result.reward, result.done) == ("goal", 1.0, True)
    env.reset(Task(task_id="f", prompt="Go.", metadata={"grid": ["SF", "HG"]}))
    assert env.step("down, no: left... down").observation == "hole"  # the last move named counts
    assert env.step("dance").observation.startswith("Answer with one move")
    grid = draw_grid(4, 0.4, "task-7")
    assert grid == draw_grid(4, 0.4, "task-7") and shortest_path(grid) >= 6  # 4x4: at least 3 down + 3 right
    assert shortest_path(["SH", "HG"]) is None


def test_frozen_lake_episodes_play_at_once_with_masks():
    engine = Recorder(build_engine({"name": "transformers", "seed": 0}, ModelSpec()))
    ctx = WorkflowContext(engine=engine, sampling=SamplingParams(max_new_tokens=6), reward=build_reward("format"))
    flow = build_batch_workflow({"name": "multi_turn", "max_turns": 3, "max_tokens": 100,
                                 "environment": {"name": "frozen_lake", "size": 3}})
    [group] = flow([Task(task_id="lake", prompt="Walk to G.", group_size=4)], ctx)
    assert engine.calls[0] == 4  # the first turn: every episode in one call
    for t in group:
        assert len(t.response_tokens) <= 100 and len(t.loss_mask) == len(t.response_tokens)
        assert t.loss_mask[0] == 1 and 1 <= t.metadata["turns"] <= 3
        observed = engine.tokenizer.decode([k for k, m in zip(t.response_tokens, t.loss_mask) if m == 0])
        assert observed.count("\nassistant: ") == t.metadata["turns"] - 1  # none after the last response
    assert max(t.metadata["turns"] for t in group) >= 2  # the game really went on after a move


def test_an_answer_without_a_call_ends_the_episode_and_a_cut_one_says_length():
    engine = build_engine({"name": "transformers", "seed": 0}, ModelSpec())
    ctx = WorkflowContext(engine=engine, sampling=SamplingParams(max_new_tokens=3), reward=build_reward("format"))
    flow = build_batch_workflow({"name": "tool_agent", "tools": ["calculator"], "parser": "pythonic"})
    [group] = flow([Task(task_id="q", prompt="2*3?", group_size=2)], ctx)
    for t in group:  # the random tiny model writes no call: its first response is its answer
        assert t.metadata == {"turns": 1, "tools": {}} and t.loss_mask == [1] * len(t.response_tokens)
        assert t.finish_reason == ("stop" if t.response_tokens[-1] == engine.tokenizer.eos_token_id else "length")
    assert "length" in {t.finish_reason for t in group}


def test_tool_results_take_the_templates_turn_markers_after_the_models_own_eos():
    tok = char_tokenizer()
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<eos>\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    from undertow.rollout.tools.chat import observation_text

    # The response ended with the EOS the template puts after a turn: the observation starts after it.
    assert observation_text(tok, ["5", "x"]) == "\ntool: 5<eos>\ntool: x<eos>\nassistant: "
    # A response cut before its EOS: the observation closes the turn first.
    assert observation_text(tok, ["5"], ended_with_eos=False) == "<eos>\ntool: 5<eos>\nassistant: "
    assert observation_text(tok, ["5"], role="user") == "\nuser: 5<eos>\nassistant: "


def test_worked_examples_come_before_each_tasks_own_messages():
    engine = build_engine({"name": "transformers", "seed": 0}, ModelSpec())
    ctx = WorkflowContext(engine=engine, sampling=SamplingParams(max_new_tokens=2), reward=build_reward("format"))
    shown = [{"role": "user", "content": "1*2?"},
             {"role": "assistant", "content": "<tool_call>calculator(expression='1*2')</tool_call>"},
             {"role": "tool", "content": "2"}, {"role": "assistant", "content": "2"}]
    flow = build_batch_workflow({"name": "tool_agent", "tools": ["calculator"], "parser": "pythonic",
                                 "examples": shown})
    [[t]] = flow([Task(task_id="q", prompt="2*3?")], ctx)
    # The tiny template writes "role: content\n" per message, after the tools' system text.
    assert t.prompt_text.endswith("\nuser: 1*2?\nassistant: <tool_call>calculator(expression='1*2')</tool_call>\n"
                                  "tool: 2\nassistant: 2\nuser: 2*3?\nassistant: ")
    assert t.prompt_text.startswith("system: Tools: calculator(")
    assert t.prompt_tokens == engine.tokenizer(t.prompt_text, add_special_tokens=False)["input_ids"]
