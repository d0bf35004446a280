"""A policy version ready to load, as a receiver hands it over: one blob, or staged bucket files."""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union


@dataclass
class Assembled:
    """A complete, checksum-verified version held as one blob (the kafka transport)."""

    model: str
    version: int
    blob: bytes

    def load_into(self, engine: Any) -> None:
        engine.load_weights(self.blob)

    def discard(self) -> None:
        pass


@dataclass
class Staged:
    """A complete, verified version as bucket files in a local staging directory (files, broadcast);
    the engine streams them in tensor by tensor, and the directory goes once loaded."""

    model: str
    version: int
    payload: str
    files: list[Path]
    directory: Path
    via: str  # the transport that brought it

    def load_into(self, engine: Any) -> None:
        try:
            if self.payload == "adapter":  # one self-describing bucket, applied whole by peft / vLLM LoRA
                engine.load_weights(self.files[0].read_bytes())
            else:
                engine.load_weight_files(self.files)
        finally:
            self.discard()

    def discard(self) -> None:
        """Take the staged files away: renamed at once, removed on a thread of their own. Freeing a
        version held in memory (/dev/shm) takes 0.1 s for SmolLM2, which the generation pause would
        otherwise include; what a killed worker left there is swept at the next broadcast."""
        gone = self.directory.with_name(self.directory.name + ".gone")
        try:
            self.directory.rename(gone)
        except OSError:  # discarded already
            return
        threading.Thread(target=shutil.rmtree, args=(gone,), kwargs={"ignore_errors": True}, name="weights-discard",
                         daemon=True).start()


Ready = Union[Assembled, Staged]
