"""Progress bars: drawn on a terminal only, and advanced by the long work that takes one: evaluation,
replay, the archiver (on the real broker) and GGUF dequantization."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from undertow.kernel.models import gguf
from undertow.kernel.progress import progress
from undertow.infra.run.config import RunConfig
from undertow.rollout.engines import build_engine
from undertow.rollout.evaluation import Evaluator
from undertow.schemas import MetricEvent
from undertow.streams import RecordProducer, RunContext, Topics
from undertow.streams.archive import ArchiveConfig, Archiver
from undertow.streams.archive_store import ArchivedMessage, ArchiveStore
from undertow.streams.history import History
from undertow.streams.replay import Selection, replay

from tests.history.helpers import recorded_run


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)  # the terminal's colour and cursor codes


def test_a_bar_draws_on_a_terminal_and_nothing_elsewhere():
    terminal, log = StringIO(), StringIO()
    with progress("archive demo-rl", unit="rows", console=Console(file=terminal, force_terminal=True, width=100)) as bar:
        bar.advance(120)
        bar.total(200)
        bar.advance(80)
    assert "archive demo-rl" in plain(terminal.getvalue()) and "200/200 rows" in plain(terminal.getvalue())
    with progress("archive demo-rl", total=3, console=Console(file=log, width=100)) as bar:
        bar.advance(3)
    assert log.getvalue() == "" and bar.done == 3  # a log file gets no redrawn bar; the work still counts


def test_an_evaluation_counts_every_prompt_of_both_passes(monkeypatch, capsys):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: stderr is a terminal
    cfg = RunConfig.model_validate({
        "rollout": {"chat_template": False, "sampling": {"max_new_tokens": 2}, "reward": "tests.rollout.plugins.sevens"},
        "eval": {"tasksets": [{"name": "sums-heldout", "source": {"name": "sums", "size": 70, "seed": 7}}],
                 "greedy": True, "samples": 2}})
    Evaluator(build_engine(cfg.rollout.engine, cfg.model), cfg.rollout, cfg.eval, "policy").evaluate(3)
    err = plain(capsys.readouterr().err)
    assert "eval v3 sums-heldout" in err and "140/140 prompts" in err  # 70 greedy + 70 sampled, in batches of 64


class AckedAtOnce:
    """A producer whose every send is acknowledged: replay's bar counts acknowledgements."""

    sent = 0

    def send(self, topic, record, key=None):
        self.sent += 1
        return self

    def get(self, timeout=None):
        return None

    def flush(self):
        pass


def test_replay_counts_what_was_acknowledged(tmp_path: Path):
    store = ArchiveStore(str(tmp_path), "ns")
    run = recorded_run(3)
    store.write_range("experiences.ready", "ns.experiences.ready", 0, 0, len(run) - 1,
                      [ArchivedMessage(r, 0, i, 1_800_000_000_000 + i, None) for i, r in enumerate(run)])
    out = StringIO()
    with progress("replay", unit="records", console=Console(file=out, force_terminal=True, width=100)) as bar:
        result = replay(History.from_archive(str(tmp_path)), Selection(), "as_is", AckedAtOnce(), "to.experiences.ready", bar)
    assert result.sent == bar.done == 12 and "12/12 records" in plain(out.getvalue())


@pytest.mark.broker
def test_the_archiver_counts_the_rows_it_wrote(kafka, namespace, tmp_path: Path):
    with RecordProducer(kafka) as p:
        for step in range(7):
            p.send(Topics(namespace).metrics, MetricEvent(component="trainer", values={"loss": 1.0}, step=step))
    out = StringIO()
    with progress("archive", unit="rows", console=Console(file=out, force_terminal=True, width=100)) as bar:
        stats = Archiver(ArchiveConfig(root=str(tmp_path), topics=["metrics"]), RunContext(namespace=namespace, kafka=kafka)).run(
            lambda: False, max_records=7, bar=bar)
    assert stats.rows == bar.done == 7 and "7/? rows" in plain(out.getvalue())


class FakeHF:
    """Stands in for transformers' GGUF loading (~30 s for SmolLM2): what is saved is what matters."""

    config = type("Config", (), {})()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        return cls()

    def save_pretrained(self, path, **kwargs):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "config.json").write_text("{}")


def test_dequantizing_a_gguf_counts_its_three_steps(monkeypatch, capsys, tmp_path: Path):
    import transformers

    monkeypatch.setattr(transformers, "AutoModelForCausalLM", FakeHF)
    monkeypatch.setattr(gguf, "write_gguf_tokenizer", lambda file, folder: (folder / "tokenizer.json").write_text("{}"))
    monkeypatch.setenv("UNDERTOW_CACHE", str(tmp_path))
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    out = gguf.dequantized_dir(tmp_path / "model.Q4_1.gguf")
    assert (Path(out) / "config.json").exists() and (Path(out) / "tokenizer.json").exists()
    err = plain(capsys.readouterr().err)
    assert "dequantize model.Q4_1.gguf" in err and "3/3 steps" in err
