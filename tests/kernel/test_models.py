"""The model contract: the same spec builds the same model; log-probs do not depend on padding."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from undertow.kernel.models import CHARSET, ModelSpec, build_model, build_tokenizer, local_dir
from undertow.schemas.logprobs import sequence_logprobs, token_logprobs


def test_same_spec_same_initial_weights_other_seed_other_weights():
    a, b = build_model(ModelSpec()), build_model(ModelSpec())
    c = build_model(ModelSpec(seed=1))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_char_tokenizer_round_trips_and_has_no_token_type_ids():
    tok = build_tokenizer(ModelSpec())
    text = "Use 3, 7, 25 to make 46:\n\n(25+3)*7-150 = 46?"  # newlines one token each, two in a row too
    enc = tok(text)
    assert len(enc["input_ids"]) == len(text) and "token_type_ids" not in enc
    assert tok.decode(enc["input_ids"]) == text
    assert len(tok) == len(CHARSET) + 4 and tok.pad_token_id == 0


def test_logprobs_do_not_depend_on_padding_side():
    spec = ModelSpec()
    tok, model = build_tokenizer(spec), build_model(spec)
    texts = ["12+7=19", "3*4=12 and more"]
    with torch.no_grad():
        left = tok(texts, return_tensors="pt", padding=True, padding_side="left")
        right = tok(texts, return_tensors="pt", padding=True, padding_side="right")
        lp_left = sequence_logprobs(model, left["input_ids"], left["attention_mask"])
        lp_right = sequence_logprobs(model, right["input_ids"], right["attention_mask"])
    n = len(texts[0]) - 1  # the short text's real tokens: left-padded at the end, right-padded at the start
    assert torch.allclose(lp_left[0, -n:], lp_right[0, :n], atol=1e-5)
    assert torch.allclose(lp_left[1], lp_right[1], atol=1e-6)


def test_token_logprobs_applies_temperature():
    logits = torch.tensor([[2.0, 0.0]])
    t = torch.tensor([0])
    assert token_logprobs(logits, t, 1.0).item() == pytest.approx(-0.126928, abs=1e-6)
    assert token_logprobs(logits, t, 2.0).item() == pytest.approx(-0.313262, abs=1e-6)


def test_hf_source_needs_a_path():
    with pytest.raises(ValidationError, match="path"):
        ModelSpec(source="hf")


def test_model_sources_are_a_registry_checked_at_load(tmp_path):
    with pytest.raises(ValidationError, match=r"model source 'onnx': unknown; expected one of \['gguf', 'hf', 'tiny'\]"):
        ModelSpec(source="onnx")
    with pytest.raises(ValueError, match="built in memory"):
        local_dir(ModelSpec())
    assert local_dir(ModelSpec(source="hf", path=str(tmp_path))) == str(tmp_path)  # where vLLM loads from
    build_model(ModelSpec(seed=3)).save_pretrained(tmp_path)
    build_tokenizer(ModelSpec()).save_pretrained(tmp_path)
    a, b = build_model(ModelSpec(seed=3)), build_model(ModelSpec(source="hf", path=str(tmp_path)))
    assert type(a) is type(b) and all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_weights_bytes_round_trip_into_another_model():
    from undertow.kernel.models import load_weights, weights_to_bytes

    trained, fresh = build_model(ModelSpec(seed=3)), build_model(ModelSpec())
    load_weights(fresh, weights_to_bytes(trained))
    assert all(torch.equal(x, y) for x, y in zip(trained.state_dict().values(), fresh.state_dict().values()))
    assert fresh.lm_head.weight.data_ptr() == fresh.transformer.wte.weight.data_ptr()  # still tied


def test_weights_of_another_architecture_are_refused():
    from undertow.kernel.models import TinyModel
    from undertow.kernel.models import load_weights, weights_to_bytes

    big = build_model(ModelSpec(tiny=TinyModel(n_embd=32)))
    with pytest.raises(ValueError, match="shape"):
        load_weights(build_model(ModelSpec()), weights_to_bytes(big))


def test_init_from_loads_an_hf_export_over_the_built_model(tmp_path):
    trained = build_model(ModelSpec(seed=5))
    trained.save_pretrained(tmp_path / "hf", safe_serialization=True)
    resumed = build_model(ModelSpec(init_from=str(tmp_path / "hf")))
    assert all(torch.equal(x, y) for x, y in zip(trained.state_dict().values(), resumed.state_dict().values()))


def test_buckets_are_safetensors_that_safetensors_itself_reads(tmp_path):
    """Our bucket writer (one copy per tensor) against the library's own reader, not against ours."""
    from safetensors import safe_open
    from safetensors.torch import load

    from undertow.kernel.models.weights import SAFETENSORS_DTYPES, safetensors_blob

    tensors = {name: (torch.randn(3, 5) * 10).to(getattr(torch, name)) for name in SAFETENSORS_DTYPES}
    tensors |= {"empty": torch.zeros(0, 4), "scalar": torch.tensor(3.5), "strided": torch.arange(12.).reshape(3, 4).t()}
    blob = safetensors_blob(tensors, {"format": "pt"})
    read = load(bytes(blob))
    assert sorted(read) == sorted(tensors)
    for name, t in tensors.items():
        assert read[name].dtype == t.dtype and read[name].shape == t.shape
        assert torch.equal(read[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name
    (tmp_path / "b.safetensors").write_bytes(blob)
    with safe_open(str(tmp_path / "b.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    with pytest.raises(ValueError, match="complex64"):
        safetensors_blob({"z": torch.zeros(2, dtype=torch.complex64)})
