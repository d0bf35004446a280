"""The tokenizer every environment loads: SmolLM2's is the GGUF file's own (checked against the file's
vocabulary and special ids, read without transformers), a model's own tokenizer class is replaced
by the plain fast one, and a tokenizer that does not give back its text is refused."""

from __future__ import annotations

import json

import pytest

from undertow.kernel.models import ModelSpec, TokenizerMismatch, build_tokenizer, find_smollm2_gguf, fingerprint
from undertow.kernel.models.gguf_tokenizer import build
from undertow.kernel.models.tokenizer import PROBES, check_round_trip, portable_dir

SMOLLM2 = ModelSpec(name="smollm2-135m", source="gguf")


@pytest.fixture(scope="module")
def gguf_fields() -> dict:
    from gguf import GGUFReader

    return {name: field.contents() for name, field in GGUFReader(str(find_smollm2_gguf())).fields.items()
            if name.startswith("tokenizer.")}


def test_smollm2_tokenizer_is_the_gguf_files_own(gguf_fields):
    tok = build_tokenizer(SMOLLM2)
    vocab = gguf_fields["tokenizer.ggml.tokens"]
    ids = tok(" 5\nHello world", add_special_tokens=False)["input_ids"]
    assert [vocab[i] for i in ids] == ["Ġ", "5", "Ċ", "Hello", "Ġworld"]  # byte-level: space Ġ, newline Ċ
    assert [vocab[i] for i in tok("14", add_special_tokens=False)["input_ids"]] == ["1", "4"]  # digits apart (smollm)
    assert tok.eos_token_id == gguf_fields["tokenizer.ggml.eos_token_id"] == 2  # <|im_end|> ends an answer
    assert tok.bos_token_id == gguf_fields["tokenizer.ggml.bos_token_id"]
    assert not gguf_fields["tokenizer.ggml.add_bos_token"] and tok("Hi")["input_ids"] == tok("Hi", add_special_tokens=False)["input_ids"]
    assert [tok.decode(tok(p, add_special_tokens=False)["input_ids"]) for p in PROBES] == list(PROBES)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                     tokenize=False)
    assert prompt.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")


def test_a_gguf_tokenizer_not_rebuilt_is_refused_by_name(gguf_fields):
    with pytest.raises(ValueError, match="tokenizer 'llama' with pre-tokenizer 'default'.*model.source: hf"):
        build({**gguf_fields, "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default"}, "x.gguf")


def test_a_model_class_config_is_replaced_by_the_plain_fast_class_once(tmp_path, monkeypatch):
    monkeypatch.setenv("UNDERTOW_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    build_tokenizer(ModelSpec()).save_pretrained(model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizer",
                                                             "add_bos_token": True, "legacy": True}))
    copy = portable_dir(str(model))
    assert copy.startswith(str(tmp_path / "cache" / "tokenizers")) and portable_dir(str(model)) == copy
    written = json.loads((tmp_path / copy / "tokenizer_config.json").read_text())
    assert written["tokenizer_class"] == "PreTrainedTokenizerFast" and written["clean_up_tokenization_spaces"] is False
    assert "add_bos_token" not in written and "legacy" not in written
    assert portable_dir(copy) == copy  # already portable: used as it is
    tok = build_tokenizer(ModelSpec(source="hf", path=str(model)))
    assert fingerprint(tok) == fingerprint(build_tokenizer(ModelSpec()))


def test_a_tokenizer_that_drops_spaces_is_refused():
    from tokenizers import normalizers

    tok = build_tokenizer(ModelSpec())
    check_round_trip(tok, "policy")
    tok.backend_tokenizer.normalizer = normalizers.Replace(" ", "")  # what transformers 5 made of SmolLM2's
    with pytest.raises(TokenizerMismatch, match=r"does not give back its text: .* -> 'Whatis14-9\?\\nAnswer:5,"):
        check_round_trip(tok, "policy")


def test_fingerprint_tells_tokenizers_apart():
    a, b = build_tokenizer(ModelSpec()), build_tokenizer(ModelSpec())
    assert fingerprint(a) == fingerprint(b)
    b.eos_token = "<pad>"
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(build_tokenizer(SMOLLM2)) not in {fingerprint(a), fingerprint(b)}
