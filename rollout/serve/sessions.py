"""One agent episode recorded token-in / token-out (pure: a tokenizer, no engine, no broker).

An agent program replays the whole conversation on every request. Re-tokenizing that text would
give the earlier turns tokens other than those the model generated (a different split of the same
text, special tokens lost in decoding, a template that reformats a tool call), and the trainer's
importance ratios would compare log-probs of tokens the policy never produced. So a session keeps
what really happened and only appends:

    tokens = prompt_1 | generated_1 (mask 1) | new messages_2 (mask 0) | generated_2 (mask 1) | ...

The next prompt is exactly those tokens plus the tokens of the new messages. Those are found in
text: the chat template renders the conversation with each earlier assistant message replaced by
the text the model generated (so a template that would reformat a tool call renders the model's
own text), and the recorded text must be a prefix of that rendering; what follows it is the new
messages (and the generation prompt), tokenized alone. A template that does not render a turn's
end token (the tiny model's omits `<eos>`) is matched without it, and the recorded `<eos>` stays:
the model conditions on what it really produced. A conversation the recording is not a prefix of
(history edited or summarised by the agent, different tools, a template that rewrites old turns)
is refused (`SessionMismatch`), never silently re-tokenized.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from undertow.rollout.workflows.base import Trajectory


class SessionMismatch(ValueError):
    """The request's conversation does not continue the session's recorded turns."""


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The conversation through the model's chat template, ending with the generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the model's tokenizer has no chat template: chat requests cannot be rendered")
    if tools and "tools" not in tokenizer.chat_template:
        raise ValueError("the model's chat template does not render tools")
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


def tokenize(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]  # the template holds the special tokens


@dataclass
class Pending:
    """A turn's prompt before the engine answers: the full prompt, and what is new in it."""

    prompt: list[int]
    new_text: str
    new_tokens: list[int]
    rendered: str  # the template's text of the whole conversation so far (with the model's own turns)


@dataclass
class Generated:
    """What the engine returned for one turn (a `Sample`'s fields), and the policy version that made it."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    version: int


@dataclass
class Session:
    """The recorded trajectory of one session; `group_id` / `sample_index` / `group_size` place it in
    a group of episodes of one task (GRPO-style advantages need several)."""

    session_id: str
    group_id: str
    group_size: int = 1
    sample_index: int = 0
    taskset: str = "serve"
    started: float = field(default_factory=time.time)
    touched: float = field(default_factory=time.monotonic)  # its last request's end (idle expiry counts from it)
    prompt_text: str = ""
    prompt_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    turns: list[Generated] = field(default_factory=list)
    _rendered: str = ""  # the template's text of the conversation up to the last turn
    _last_raw: str = ""  # the last turn's text as generated, special tokens included
    _turn_texts: list[str] = field(default_factory=list)  # each turn's text without its end token

    def next_prompt(self, tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Pending:
        """The prompt tokens of the next turn (the session is unchanged until `record`)."""
        if not self.turns:
            text = render(tokenizer, messages, tools)
            tokens = tokenize(tokenizer, text)
            return Pending(prompt=tokens, new_text=text, new_tokens=tokens, rendered=text)
        said = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if len(said) != len(self.turns):
            raise SessionMismatch(f"the conversation has {len(said)} assistant message(s); session "
                                  f"{self.session_id!r} recorded {len(self.turns)} turn(s)")
        if messages[-1]["role"] == "assistant":
            raise SessionMismatch("the last message is the assistant's: nothing new to answer")
        replayed = [dict(m) for m in messages]
        for i, turn_text in zip(said, self._turn_texts):
            replayed[i] = {"role": "assistant", "content": turn_text}  # the model's own text, calls and all
        text = render(tokenizer, replayed, tools)
        for recorded in self._recorded_prefixes():
            if text.startswith(recorded):
                new_text = text[len(recorded):]
                new_tokens = tokenize(tokenizer, new_text)
                return Pending(prompt=self.prompt_tokens + self.tokens + new_tokens, new_text=new_text,
                               new_tokens=new_tokens, rendered=text)
        raise SessionMismatch(f"the conversation does not continue session {self.session_id!r}'s recorded turns "
                              "(earlier messages or tools changed, or the chat template rewrites old turns)")

    def record(self, pending: Pending, generated: Generated, tokenizer: Any) -> None:
        """Append a turn: the new messages' tokens (mask 0), then the engine's tokens as generated (mask 1)."""
        if not self.turns:
            self.prompt_text, self.prompt_tokens = pending.new_text, list(pending.new_tokens)
        elif pending.new_tokens or pending.new_text:
            self.tokens += pending.new_tokens
            self.mask += [0] * len(pending.new_tokens)
            # Not the policy's tokens: masked out of the loss, so their log-prob is never read.
            self.logprobs += [0.0] * len(pending.new_tokens)
            self.texts.append(pending.new_text)
        self._rendered = pending.rendered
        self.tokens += generated.tokens
        self.mask += [1] * len(generated.tokens)
        self.logprobs += generated.logprobs
        raw = tokenizer.decode(generated.tokens, skip_special_tokens=False)
        self.texts.append(raw)
        self._last_raw = raw
        self._turn_texts.append(tokenizer.decode(self._without_end(generated, tokenizer), skip_special_tokens=False))
        self.turns.append(generated)

    def trajectory(self, components: dict[str, float]) -> Trajectory:
        """The whole episode as one trajectory, scored with the agent's reward `components`."""
        if not self.turns:
            raise SessionMismatch(f"session {self.session_id!r} has no turn to publish")
        versions = [t.version for t in self.turns]
        return Trajectory(prompt_text=self.prompt_text, prompt_tokens=self.prompt_tokens,
                          response_text="".join(self.texts), response_tokens=list(self.tokens),
                          logprobs=list(self.logprobs), loss_mask=list(self.mask),
                          finish_reason=self.turns[-1].finish_reason, reward_components=dict(components),
                          metadata={"session": self.session_id, "turns": len(self.turns),
                                    "turn_versions": versions})

    @property
    def policy_version(self) -> int:
        """The oldest version that generated a turn: staleness is counted from it (conservative)."""
        return min(t.version for t in self.turns)

    def _recorded_prefixes(self) -> list[str]:
        """What the template's rendering must start with: the conversation as it rendered it up to the
        last turn, then that turn as generated, or (when it ended on the end token, which the template
        may render itself or not at all) without its end token."""
        full, stripped = self._rendered + self._last_raw, self._rendered + self._turn_texts[-1]
        return [full] if stripped == full else [full, stripped]

    @staticmethod
    def _without_end(generated: Generated, tokenizer: Any) -> list[int]:
        if generated.finish_reason == "stop" and generated.tokens and generated.tokens[-1] == tokenizer.eos_token_id:
            return generated.tokens[:-1]
        return generated.tokens
