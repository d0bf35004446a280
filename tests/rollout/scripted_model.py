"""A tiny model taught one tool-using conversation by heart, so that greedy decoding replays it.

A random tiny model never writes a tool call. This one is trained (a few hundred Adam steps on the
conversation's own text, seconds on a CPU) until its greedy continuation of the script's prompt is
the script: a calculator call, a call to a tool that hangs, a call to an unknown tool, then the
answer. The observations between are what the tool_agent workflow feeds back (its own rendering),
so the real engine, real sandbox and real workflow produce the whole episode.
"""

from __future__ import annotations

from pathlib import Path

import torch

from undertow.kernel.models import ModelSpec, build_model, build_tokenizer, weights_to_bytes
from undertow.kernel.models.spec import TinyModel
from undertow.rollout.tools import resolve_tools
from undertow.rollout.tools.chat import observation_text, tool_prompt

TOOLS = ["calculator", "tests.rollout.tool_plugins.hang"]
QUESTION = "What is 48213*7741?"
ANSWER = "373216833"  # 48213 * 7741: 48213*7000 = 337491000, + 48213*741 = 35725833
RESPONSES = ["<tool_call>calculator(expression='48213*7741')</tool_call>", "<tool_call>hang(seconds=60)</tool_call>",
             "<tool_call>nope()</tool_call>", f"It is {ANSWER}."]
TIMEOUT_S = 1.0
RESULTS = [ANSWER, f"error: hang timed out after {TIMEOUT_S:g} s", "error: unknown tool 'nope'; tools: calculator, hang"]
SPEC = ModelSpec(tiny=TinyModel(n_positions=640))


def script_text(tok) -> tuple[str, str]:
    """The prompt, and everything after it, as the workflow renders them (responses end with EOS)."""
    prompt = tool_prompt(tok, [{"role": "user", "content": QUESTION}], resolve_tools(TOOLS), "pythonic")
    after = ""
    for response, result in zip(RESPONSES, RESULTS + [None]):
        after += response + tok.eos_token
        if result is not None:
            after += observation_text(tok, [result])
    return prompt, after


def train_scripted(path: Path, steps: int = 200) -> Path:
    """Train the tiny model on the script and save it as safetensors at `path` (ModelSpec.init_from)."""
    tok = build_tokenizer(SPEC)
    prompt, after = script_text(tok)
    ids, labels = [], []  # learn the responses only: the prompt and observations are given
    for i, part in enumerate([prompt, *_parts(tok, after)]):
        part_ids = tok(part, add_special_tokens=False)["input_ids"]
        ids += part_ids
        labels += part_ids if i % 2 else [-100] * len(part_ids)
    ids, labels = torch.tensor([ids]), torch.tensor([labels])  # [1, T]
    model = build_model(SPEC)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~40 steps of a 600-token sequence: one thread is faster on a shared CPU
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for step in range(steps):
        out = model(input_ids=ids, labels=labels)
        # Done once every response token is the argmax after its exact prefix: greedy decoding replays it.
        given = labels[0, 1:] == -100
        if bool((given | (out.logits[0, :-1].argmax(-1) == labels[0, 1:])).all()):
            break
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    else:
        raise AssertionError(f"the tiny model did not learn the script in {steps} steps")
    torch.set_num_threads(threads)
    path.write_bytes(weights_to_bytes(model))
    return path


def _parts(tok, after: str) -> list[str]:
    """Responses (with their EOS) and observations, alternating."""
    parts = []
    for response, result in zip(RESPONSES, RESULTS + [None]):
        parts.append(response + tok.eos_token)
        if result is not None:
            parts.append(observation_text(tok, [result]))
    assert "".join(parts) == after
    return parts
