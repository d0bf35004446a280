"""Damaged checkpoints on disk: a truncated DeepSpeed file, a corrupt trainer_state.json and LATEST
naming a missing directory are each detected and the resume falls back to the previous sound
checkpoint, with its offsets, trained ids and ledger; a full disk mid-save leaves no checkpoint
a resume would take. Real DeepSpeed checkpoints of the tiny model, written by checkpoint_script.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from .helpers import PYTHON, trainer_env

ROOT = Path(__file__).resolve().parents[2]


class Script:
    """checkpoint_script.py: saves, then waits for the directories to resume."""

    def __init__(self, root: Path):
        env = trainer_env()  # the script picks a free port
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen([PYTHON, "tests/trainer/checkpoint_script.py", str(root)], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []

    def result(self, mark: str) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith(mark + " "):
                return json.loads(line[len(mark) + 1:])
        self.proc.wait(60)
        raise AssertionError("".join(self.lines)[-8000:])

    def resume(self, roots: list[Path]) -> tuple[dict, str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([str(r) for r in roots]) + "\n")
        self.proc.stdin.flush()
        loaded = self.result("LOADED")
        assert self.proc.wait(60) == 0
        return loaded, "".join(self.lines)


def flip_first_byte(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(b"X" + data[1:])  # '{' gone: not JSON any more, and the size tells nothing


def test_damaged_checkpoints_fall_back_to_the_previous_sound_one(tmp_path: Path):
    run = tmp_path / "run"
    script = Script(run)
    saved = script.result("SAVED")
    # The full disk at step 3's save: a clear message, no step-3 directory (whole or partial), LATEST at 2.
    assert "DiskFull: checkpoint step-00000003: no space left on the device" in saved["full_disk"]
    assert sorted(p.name for p in run.iterdir()) == ["LATEST", "ledger.jsonl", "step-00000001", "step-00000002"]
    assert (run / "LATEST").read_text() == "step-00000002"
    assert json.loads((run / "step-00000002" / "checksums.json").read_text())["files"]["trainer_state.json"]

    damage = {
        "truncated": lambda d: os.truncate(d / "step-00000002" / "mp_rank_00_model_states.pt", 1000),
        "corrupt_state": lambda d: flip_first_byte(d / "step-00000002" / "trainer_state.json"),  # same size
        "dangling_latest": lambda d: shutil.rmtree(d / "step-00000002"),  # LATEST still names it
        "sound": lambda d: None,
    }
    for name, harm in damage.items():
        shutil.copytree(run, tmp_path / name)
        harm(tmp_path / name)
    loaded, log = script.resume([tmp_path / name for name in damage])

    assert loaded["sound"] == {"step": 2, "offsets": 16, "trained_ids": 16, "sha": saved["sha2"], "ledger": [1, 2]}
    for name in ("truncated", "corrupt_state", "dangling_latest"):
        # step 1's weights, offsets and ids; the ledger cut back: step 2's records will be trained once more, once
        assert loaded[name] == {"step": 1, "offsets": 8, "trained_ids": 8, "sha": saved["sha1"], "ledger": [1]}, name
        assert (tmp_path / name / "LATEST").read_text() == "step-00000001"
    assert "mp_rank_00_model_states.pt has 1000 bytes" in log
    assert "trainer_state.json does not match its sha256" in log
    assert "step-00000002 (LATEST: step-00000002) is damaged: the directory does not exist" in log
    # the damaged ones are set aside for inspection, out of pruning's and the next resume's way
    assert (tmp_path / "truncated" / "damaged-step-00000002" / "DAMAGED.txt").exists()
    assert not (tmp_path / "truncated" / "step-00000002").exists()
