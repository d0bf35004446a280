"""One tokenizer in both environments: the vLLM environment (transformers 5, this test) and the main
one (transformers 4, the trainer's) encode and decode the probe texts alike for every shipped model
config and for HF directories, and vLLM's own tokenizer agrees. Today's bug is one of the cases: an
HF directory whose tokenizer config names `LlamaTokenizer` over a byte-level BPE (transformers 5
rebuilt it without spaces or newlines)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from undertow.kernel.models import ModelSpec, local_dir, tokenizer_dir
from undertow.kernel.models.tokenizer import PROBES, ROUND_TRIP, encodings
from tests.vllm.tokenizer_report import report
from tests.vllm.trainer_logprobs import in_main_environment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMOLLM2 = {"name": "smollm2-135m", "source": "gguf"}
# SmolLM2's tokenizer config as transformers 4.57's GGUF conversion wrote it (the cause of the bug).
LLAMA_CLASS_CONFIG = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
                      "legacy": True, "clean_up_tokenization_spaces": True, "bos_token": "<|im_start|>",
                      "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>"}


def shipped_models() -> list[dict]:
    """Every distinct `model:` of examples/*.yaml, stage overrides included."""
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        stages = (config.get("run") or {}).get("stages") or []
        for model in [config.get("model")] + [s.get("model") for s in stages]:
            if model is not None and model not in found:
                found.append(model)
    return found


@pytest.fixture(scope="module")
def llama_class_dir(tmp_path_factory) -> dict:
    """SmolLM2's tokenizer.json under the class config that broke it, as an HF directory."""
    folder = tmp_path_factory.mktemp("smollm2-llama-class")
    shutil.copy(Path(local_dir(ModelSpec(**SMOLLM2))) / "tokenizer.json", folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(LLAMA_CLASS_CONFIG))
    return {"source": "hf", "path": str(folder)}


def test_every_model_tokenizes_alike_in_both_environments_and_in_vllm(llama_dir, llama_class_dir):
    from vllm.tokenizers.registry import get_tokenizer

    models = shipped_models()
    assert {m["source"] for m in models} == {"tiny", "gguf"} and len(models) == 3  # demo's tiny, the default tiny, SmolLM2
    models += [{"source": "hf", "path": str(llama_dir)}, llama_class_dir]
    byte_level = [SMOLLM2, llama_class_dir]  # every text comes back (the tiny ones know ASCII only)
    here = [report(m) for m in models]
    there = in_main_environment("tests.vllm.tokenizer_report", models)
    for model, mine, trainers in zip(models, here, there):
        classes = mine.pop("class"), trainers.pop("class")  # transformers 5 renamed the fast class
        assert mine == trainers, f"{model}: vLLM environment ({classes[0]}) != main ({classes[1]})"
        assert mine["decoded"][0] == ROUND_TRIP
        if model in byte_level:
            assert mine["decoded"] == list(PROBES), model
        if model["source"] != "tiny":
            spec = ModelSpec(**model)
            assert encodings(get_tokenizer(tokenizer_dir(spec))) == mine["encodings"], f"{model}: vLLM's own view"
    print("fingerprints:", {json.dumps(m): r["fingerprint"] for m, r in zip(models, here)})
