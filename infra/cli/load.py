"""`undertow load CONFIG FILE`: preference pairs or SFT conversations from a JSONL or Parquet file onto
the run's `experiences.ready`, the topic its trainer reads; `--train` trains on them in the same command.

Rows (JSONL: one JSON object a line; Parquet: one a row), in the shape the config's objective reads:

    pairs (dpo, kto, simpo, orpo)   {"prompt": …, "chosen": …, "rejected": …}
    SFT (sft)                       {"prompt": …, "response": …}   ("completion" is read as "response")
                                    {"messages": [{"role": …, "content": …}, …, {"role": "assistant", …}]}

A prompt is text or a list of chat messages; an answer is text or a list of messages whose last one is
the assistant's (TRL's conversational form). With `messages`, the last (assistant) message is the
response trained on and every message before it the prompt.

Token ids are those a rollout worker of this run makes: the prompt through the rollout's own
`prompt_tokens` (the chat template when the tokenizer has one and `rollout.chat_template` is on, and
always for messages), the answer as its tokens then end of sequence (as the reference workflow's
demonstrations). Records are stamped with the tokenizer's fingerprint, which the trainer checks.

Bad input gets a clear error and loses nothing: every bad row is reported as FILE:LINE and why, and by
default the file is refused whole (nothing sent); with `--skip-bad` the good rows are sent and each bad
one goes to `experiences.rejected` (stage `load`, reason `invalid`, the row as it was). Ids are
`<file stem>:<line>:<digest of the row>`: loading the same file again trains nothing twice (the trainer
skips the ids it trained); `--epochs N` sends N copies, ids suffixed `/epoch-k` from the second on.
With `--to expert`, SFT rows go to `experiences.expert` instead: the demonstrations an RL run with
`trainer.mixing` (CHORD) takes into each of its steps.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import typer
from pydantic import ValidationError

from undertow.infra.cli.common import component, console, user_errors
from undertow.schemas import Experience, PreferencePair, Record

STAGE = "load"
SHOWN = 20  # bad rows listed in an error; the count says how many more


class RowError(ValueError):
    """What is wrong with one row, in words a user can act on."""


@dataclass
class Row:
    """One row of the file: its line (JSONL) or row number (Parquet, from 1), as it was, and parsed."""

    line: int
    raw: bytes
    data: dict[str, Any] | None = None
    error: str | None = None


def read_rows(path: Path) -> Iterator[Row]:
    """The file's rows; a line that is not a JSON object comes back with its error."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, data in enumerate(pq.read_table(path).to_pylist(), 1):
            yield Row(i, json.dumps(data, default=str).encode(), data)
        return
    if path.suffix not in (".jsonl", ".json", ".ndjson"):
        raise ValueError(f"{path.name}: expected a .jsonl (one JSON object a line) or .parquet file")
    with path.open("rb") as f:
        for i, raw in enumerate(f, 1):
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except ValueError as e:
                yield Row(i, raw, error=f"not JSON ({e})")
                continue
            yield Row(i, raw, data) if isinstance(data, dict) else Row(i, raw, error="expected a JSON object")


class _TokenizerOnly:
    """What `prompt_tokens` reads of an engine: its tokenizer (no model is loaded to tokenize)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer


class Encoder:
    """Token ids as a rollout worker of this run makes them (rollout.workflows.base.prompt_tokens)."""

    def __init__(self, tokenizer: Any, chat_template: bool):
        from undertow.kernel.models.tokenizer import fingerprint
        from undertow.rollout.engines.base import SamplingParams
        from undertow.rollout.workflows.base import WorkflowContext

        self.tok = tokenizer
        self.ctx = WorkflowContext(engine=_TokenizerOnly(tokenizer), sampling=SamplingParams(), reward=None,
                                   chat_template=chat_template)
        self.stamp = fingerprint(tokenizer)

    def prompt(self, prompt: Any, name: str = "prompt") -> tuple[str, list[int]]:
        from undertow.rollout.workflows.base import prompt_tokens
        from undertow.schemas import Task

        messages = _messages(prompt, name) if isinstance(prompt, list) else []
        if messages and not getattr(self.tok, "chat_template", None):
            raise RowError(f"{name}: chat messages need a chat template, and the model's tokenizer has none")
        text = "" if messages else _text(prompt, name)
        try:
            task = Task(task_id="load", prompt=text, messages=messages, created_at=time.time())
        except ValidationError as e:
            raise RowError(f"{name}: {e.errors()[0]['msg']}") from None
        text, tokens = prompt_tokens(task, self.ctx)
        if not tokens:
            raise RowError(f"{name}: no tokens")
        return text, tokens

    def answer(self, answer: Any, name: str) -> tuple[str, list[int]]:
        if isinstance(answer, list):
            last = (_messages(answer, name) or [{}])[-1]
            if last.get("role") != "assistant":
                raise RowError(f"{name}: the last message should be the assistant's answer")
            answer = last["content"]
        text = _text(answer, name)
        return text, self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise RowError(f"{name}: expected non-empty text or a list of chat messages, got {_shown(value)}")
    return value


def _messages(value: list, name: str) -> list[dict[str, str]]:
    if not value:
        raise RowError(f"{name}: an empty list of messages")
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise RowError(f"{name}[{i}]: expected {{\"role\": text, \"content\": text}}, got {_shown(m)}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _need(data: dict[str, Any], keys: tuple[str, ...], shape: str) -> None:
    missing = [k for k in keys if data.get(k) is None]
    if missing:
        raise RowError(f"missing {', '.join(missing)} (a row of {shape} has {', '.join(keys)}; "
                       f"it has {', '.join(sorted(data)) or 'nothing'})")


def to_pair(data: dict[str, Any], enc: Encoder, rid: str, meta: dict[str, Any]) -> PreferencePair:
    """{"prompt", "chosen", "rejected"} -> a PreferencePair."""
    _need(data, ("prompt", "chosen", "rejected"), "preference pairs")
    prompt, prompt_ids = enc.prompt(data["prompt"])
    chosen, chosen_ids = enc.answer(data["chosen"], "chosen")
    rejected, rejected_ids = enc.answer(data["rejected"], "rejected")
    return PreferencePair(pair_id=rid, task_id=rid, prompt_text=prompt, prompt_tokens=prompt_ids, chosen_text=chosen,
                          chosen_tokens=chosen_ids, rejected_text=rejected, rejected_tokens=rejected_ids, metadata=meta)


def to_sft(data: dict[str, Any], enc: Encoder, rid: str, meta: dict[str, Any]) -> Experience:
    """{"prompt", "response" | "completion"} or {"messages"} -> an Experience, a group of one."""
    messages = data.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or len(messages) < 2:
            raise RowError("messages: expected a list of at least a prompt message and the assistant's answer")
        prompt, prompt_ids = enc.prompt(messages[:-1], "messages")
        response, response_ids = enc.answer(messages[-1:], "messages")
    else:
        data = {"response": data.get("completion"), **{k: v for k, v in data.items() if v is not None}}
        _need(data, ("prompt", "response"), "SFT")
        prompt, prompt_ids = enc.prompt(data["prompt"])
        response, response_ids = enc.answer(data["response"], "response")
    return Experience(experience_id=rid, task_id=rid, group_id=rid, prompt_text=prompt, prompt_tokens=prompt_ids,
                      response_text=response, response_tokens=response_ids, policy_version=0, finish_reason="stop",
                      metadata=meta)


# What each record type a trainer reads is made from (the objective names the record type).
SHAPES: dict[type[Record], Callable[..., Record]] = {PreferencePair: to_pair, Experience: to_sft}


@dataclass
class Parsed:
    """The records made from a file, and its bad rows with why."""

    records: list[Record] = field(default_factory=list)
    bad: list[tuple[Row, str]] = field(default_factory=list)

    def report(self, path: Path) -> list[str]:
        return [f"{path.name}:{row.line}: {why}" for row, why in self.bad]


def parse(path: Path, record_type: type[Record], enc: Encoder) -> Parsed:
    """Every row of `path` as a record of `record_type`, or a bad row with its reason."""
    make, out = SHAPES[record_type], Parsed()
    stem = path.stem[:100]
    for row in read_rows(path):
        if row.error is not None:
            out.bad.append((row, row.error))
            continue
        rid = f"{stem}:{row.line}:{hashlib.sha256(row.raw).hexdigest()[:10]}"
        try:
            out.records.append(make(row.data, enc, rid, {"source": f"{path.name}:{row.line}", "tokenizer": enc.stamp}))
        except RowError as e:
            out.bad.append((row, str(e)))
        except ValidationError as e:  # a record bound the row broke (e.g. too many tokens)
            err = e.errors()[0]
            out.bad.append((row, f"{'.'.join(map(str, err['loc']))}: {err['msg']}"))
    return out


def epochs_of(records: list[Record], epochs: int) -> list[Record]:
    """The records `epochs` times; copies after the first get ids of their own, so the trainer trains each."""
    out = list(records)
    for k in range(1, epochs):
        for r in records:
            rid = f"{getattr(r, r.id_field)}/epoch-{k}"
            out.append(r.model_copy(update={r.id_field: rid, **({"group_id": rid} if isinstance(r, Experience) else {})}))
    return out


def send(producer: Any, topics: Any, records: list[Record], bad: list[tuple[Row, str]], path: Path,
         topic: str | None = None) -> None:
    """Records to the ready topic (or `topic`), bad rows to the rejected one; returns once the brokers
    acknowledged all."""
    from undertow.streams.replay import replay_key

    futures = [producer.send(topic or topics.ready, r, key=replay_key(r)) for r in records]
    futures += [producer.reject(topics.rejected, stage=STAGE, reason="invalid", detail=f"{path.name}:{row.line}: {why}",
                                original=row.raw, record_id=f"{path.stem[:100]}:{row.line}") for row, why in bad]
    producer.flush()
    for f in futures:
        f.get(timeout=60)  # raises if the broker refused one


def record_type_of(cfg: Any, expert: bool = False) -> type[Record]:
    """The record type the config's trainer reads; an objective that trains on rollouts is refused.
    Demonstrations for the expert topic are SFT conversations, read by an RL run's `trainer.mixing`."""
    from undertow.trainer.objectives import objectives

    if expert:
        if cfg.trainer.mixing is None:
            raise ValueError("--to expert: the config sets no trainer.mixing, so no trainer would read them")
        return Experience

    objective = objectives.get(cfg.trainer.algorithm.objective)(cfg.trainer.algorithm)
    if objective.importance_sampled or objective.record_type not in SHAPES:
        raise ValueError(f"trainer.algorithm.objective: {cfg.trainer.algorithm.objective} trains on rollouts; "
                         "load feeds the offline objectives (sft on conversations; dpo, kto, simpo, orpo on pairs)")
    return objective.record_type


def load(config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Run config (YAML): namespace, model, objective."),
         file: Path = typer.Argument(..., exists=True, dir_okay=False, help="Rows as .jsonl or .parquet."),
         skip_bad: bool = typer.Option(False, "--skip-bad", help="Send the good rows and each bad one to "
                                       "experiences.rejected (default: refuse the whole file)."),
         epochs: int = typer.Option(1, min=1, help="Send the rows this many times (each copy is trained on)."),
         train: bool = typer.Option(False, "--train", help="Then train on them here (undertow train CONFIG) until "
                                    "no data came for --idle-timeout seconds."),
         max_steps: Optional[int] = typer.Option(None, help="With --train: stop after this many steps in total."),
         idle_timeout: float = typer.Option(20.0, help="With --train: stop after this many seconds without data."),
         nproc: int = typer.Option(1, min=1, help="With --train: data-parallel trainer processes (torchrun)."),
         to: str = typer.Option("ready", "--to", help="ready: what the trainer trains on; expert: demonstrations an "
                                "RL run mixes into its steps (trainer.mixing, CHORD)."),
         ) -> None:
    """Put preference pairs or SFT conversations from a file on the run's ready topic (then, with --train, train),
    or demonstrations on its expert topic (--to expert)."""
    from undertow.kernel.models import build_tokenizer
    from undertow.kernel.progress import progress
    from undertow.streams import RecordProducer, Topics, create_topics

    with user_errors():
        if to not in ("ready", "expert"):
            raise ValueError(f"--to: expected ready or expert, got {to!r}")
        if to == "expert" and train:
            raise ValueError("--train: an RL run trains on rollouts; start it (undertow run) to use the demonstrations")
        cfg, context = component(config)
        record_type = record_type_of(cfg, expert=to == "expert")
        with progress(f"tokenize {file.name}", unit="rows"):
            parsed = parse(file, record_type, Encoder(build_tokenizer(context.model), cfg.rollout.chat_template))
        topics = Topics(context.namespace)
        for line in parsed.report(file)[:SHOWN]:
            console.print(line, highlight=False, markup=False, soft_wrap=True)
        if parsed.bad and not skip_bad:
            more = f" ({len(parsed.bad) - SHOWN} more not shown)" if len(parsed.bad) > SHOWN else ""
            raise ValueError(f"{len(parsed.bad)} bad row(s) in {file.name}{more}; nothing was sent. Fix them, or "
                             f"--skip-bad to send the {len(parsed.records)} good ones and the bad ones to {topics.rejected}")
        if not parsed.records:
            raise ValueError(f"{file.name}: no rows to send")
        records = epochs_of(parsed.records, epochs)
        create_topics(context.kafka, context.namespace)
        topic = topics.expert if to == "expert" else topics.ready
        with RecordProducer(context.kafka) as producer:
            send(producer, topics, records, parsed.bad, file, topic)
        kind = "pairs" if record_type is PreferencePair else "conversations"
        console.print(f"loaded {len(records)} {kind} ({len(parsed.records)} rows × {epochs} epochs) to {topic}"
                      + (f"; {len(parsed.bad)} bad rows to {topics.rejected}" if parsed.bad else ""), soft_wrap=True)
    if train:  # through the command line's own parsing, so that every other `train` option keeps its default
        from undertow.infra.cli import app

        app(["train", str(config), "--idle-timeout", str(idle_timeout), "--nproc", str(nproc),
             *(["--max-steps", str(max_steps)] if max_steps else [])], standalone_mode=False)
