"""`undertow load` without a broker: rows of pairs and conversations tokenized as a rollout worker of
the run would, every bad row named by its line, epochs, and the objective deciding the shape."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from undertow.infra.cli.load import Encoder, epochs_of, parse, record_type_of
from undertow.infra.run.config import load_component_config
from undertow.kernel.models import ModelSpec, build_tokenizer
from undertow.schemas import Experience, PreferencePair
from tests.helpers import write_config

TOK = build_tokenizer(ModelSpec())  # the tiny model's character tokenizer, with its chat template


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_pairs_are_tokenized_as_the_rollout_does_and_bad_rows_named_by_line(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [
        {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
        {"prompt": [{"role": "user", "content": "1+1="}], "chosen": [{"role": "assistant", "content": "2"}],
         "rejected": "3"},
        "",  # blank lines are skipped, and still counted
        "{not json",
        {"prompt": "2+2=", "chosen": "", "rejected": "5"},
        {"prompt": "2+2=", "rejected": "5"},
        [1, 2],
        {"prompt": [{"role": "user"}], "chosen": "4", "rejected": "5"},
        {"prompt": "3+3=", "chosen": [{"role": "user", "content": "6"}], "rejected": "7"},
    ])
    out = parse(path, PreferencePair, Encoder(TOK, chat_template=True))
    first, second = out.records
    # The tiny template: "user: …\nassistant: " (kernel/models/tiny.py); the answer ends with EOS.
    assert first.prompt_text == "user: 2+2=\nassistant: " and first.prompt_tokens == ids("user: 2+2=\nassistant: ")
    assert first.chosen_tokens == ids("4") + [TOK.eos_token_id] and first.rejected_tokens == ids("5") + [TOK.eos_token_id]
    assert second.prompt_text == "user: 1+1=\nassistant: " and second.chosen_text == "2"
    assert first.pair_id.startswith("pairs:1:") and second.pair_id.startswith("pairs:2:")
    assert first.metadata["source"] == "pairs.jsonl:1" and first.metadata["tokenizer"]
    assert [(row.line, why.split(":")[0].split(" (")[0]) for row, why in out.bad] == [
        (4, "not JSON"), (5, "chosen"), (6, "missing chosen"), (7, "expected a JSON object"), (8, "prompt[0]"), (9, "chosen")]
    assert out.report(path)[0].startswith("pairs.jsonl:4: not JSON")
    assert out.bad[0][0].raw == b"{not json"  # kept as it was, for the rejected topic
    # Without the chat template a plain prompt is its raw text (the rollout's rule, rollout.chat_template off).
    raw = parse(path, PreferencePair, Encoder(TOK, chat_template=False)).records[0]
    assert raw.prompt_text == "2+2=" and raw.prompt_tokens == ids("2+2=")


def test_sft_conversations_from_parquet(tmp_path):
    path = tmp_path / "sft.parquet"
    messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+3="},
                {"role": "assistant", "content": "5"}]
    pq.write_table(pa.Table.from_pylist([{"messages": messages, "prompt": None, "completion": None},
                                         {"messages": None, "prompt": "1+2=", "completion": "3"},
                                         {"messages": messages[:1], "prompt": None, "completion": None}]), path)
    out = parse(path, Experience, Encoder(TOK, chat_template=True))
    chat, plain = out.records
    template = TOK.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=False)
    assert chat.prompt_tokens == ids(template) and chat.response_tokens == ids("5") + [TOK.eos_token_id]
    assert chat.group_id == chat.experience_id and chat.group_size == 1 and chat.finish_reason == "stop"
    assert plain.prompt_text == "user: 1+2=\nassistant: " and plain.response_text == "3"
    assert [(row.line, why.split(":")[0]) for row, why in out.bad] == [(3, "messages")]


def test_epochs_give_every_copy_its_own_id_and_the_objective_picks_the_shape(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "2+2=", "chosen": "4", "rejected": "5"}])
    (pair,) = parse(path, PreferencePair, Encoder(TOK, chat_template=True)).records
    copies = epochs_of([pair], 3)
    assert [c.pair_id for c in copies] == [pair.pair_id, f"{pair.pair_id}/epoch-1", f"{pair.pair_id}/epoch-2"]
    # The same row loaded again has the same id: the trainer does not train it twice.
    assert parse(path, PreferencePair, Encoder(TOK, chat_template=True)).records[0].pair_id == pair.pair_id
    # As a component command reads its config (`undertow run`'s rule on the processors' record type aside).
    trainer = lambda objective: load_component_config(write_config(tmp_path / f"{objective}.yaml", "ns",
                                                                   trainer={"algorithm": {"objective": objective}}))
    assert [record_type_of(trainer(o)) for o in ("dpo", "kto", "simpo", "orpo", "sft")] == [PreferencePair] * 4 + [Experience]
    with pytest.raises(ValueError, match="rl trains on rollouts"):
        record_type_of(trainer("rl"))
