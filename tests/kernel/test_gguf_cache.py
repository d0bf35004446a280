"""The dequantized GGUF cache (kernel/models/gguf.py) is made once, by one process, when a run's
components all start on a machine that has none yet (the vLLM environment's side: tests/vllm)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from undertow.kernel.models import gguf


class SlowHF:
    """transformers' GGUF loading, slow as it is (~30 s for SmolLM2), counting the conversions."""

    loads = 0

    def __init__(self):
        self.config, self.hf_quantizer = type("Config", (), {})(), "a GgufQuantizer"
        self.config.quantization_config = {"quant_method": "gguf"}

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        cls.loads += 1
        time.sleep(0.5)
        return cls()

    def save_pretrained(self, path, **kwargs):
        assert self.hf_quantizer is None and not hasattr(self.config, "quantization_config")  # saved as plain weights
        Path(path).mkdir(parents=True)
        (Path(path) / "config.json").write_text("{}")


def test_components_starting_together_convert_the_gguf_once(monkeypatch, tmp_path: Path):
    import transformers

    monkeypatch.setattr(transformers, "AutoModelForCausalLM", SlowHF)
    monkeypatch.setattr(gguf, "write_gguf_tokenizer", lambda file, folder: (folder / "tokenizer.json").write_text("{}"))
    monkeypatch.setenv("UNDERTOW_CACHE", str(tmp_path))
    made, errors = [], []

    def component() -> None:
        try:
            made.append(gguf.dequantized_dir(tmp_path / "model.Q4_1.gguf"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=component) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and len(set(made)) == 1 and len(made) == 3
    assert SlowHF.loads == 1
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["model.Q4_1", "model.Q4_1.lock"]
