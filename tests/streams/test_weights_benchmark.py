"""The weights benchmark's arguments (benchmarks/trainer_weights.py): a wrong dtype is named, not an AttributeError."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def benchmark():
    spec = importlib.util.spec_from_file_location("trainer_weights", ROOT / "benchmarks" / "trainer_weights.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("given, said", [
    ("float32,float33", "'float33' is not a torch dtype (choose from float32, bfloat16)"),
    ("float16", "'float16' is a torch dtype the model spec does not take (choose from float32, bfloat16)"),
])
def test_a_wrong_dtype_is_named(given, said, capsys):
    with pytest.raises(SystemExit) as exit:
        benchmark().parser().parse_args(["--dtypes", given])
    assert exit.value.code == 2 and f"--dtypes: {said}" in capsys.readouterr().err


def test_torch_names_are_taken():
    assert benchmark().parser().parse_args(["--dtypes", "bfloat16, float32"]).dtypes == ["bfloat16", "float32"]
