"""An LLM judge: a rubric prompt filled with the prompt, the response and the reference answer, and a verdict.

Two verdicts:
- `labels` (default): the probability the judge gives the first label as its answer's first token,
  among the labels: P("Yes") / (P("Yes") + P("No")). Robust for small models, which rarely keep to a
  format but always rank the next token, and a graded value in [0, 1] rather than a coin flip.
- `regex`: the judge writes (greedy) and `pattern`'s first group, in its last match, is the score,
  normalised to [0, 1] over `score_range` ("Score: 7" on 0..10 -> 0.7). No match, or a score outside
  the range, is UNPARSABLE.
The answers come from a local causal LM (`path`) or an OpenAI-compatible endpoint (`base_url` and
`model`): backends.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import DirectoryPath, FilePath

from undertow.kernel.scoring.backends import OpenAIBackend, TransformersBackend
from undertow.kernel.scoring.base import UNPARSABLE, Item, ModelScorer, Scored, existing_dir, fill, fingerprint

LABELS_RUBRIC = ("Decide whether the answer to the question is correct.\n"
                 "Question: {prompt}\nReference answer: {reference}\nAnswer: {response}\n"
                 "Is the answer correct? Reply Yes or No.")
SCORE_RUBRIC = ("Rate the answer to the question from 0 (wrong) to 10 (fully correct).\n"
                "Question: {prompt}\nReference answer: {reference}\nAnswer: {response}\n"
                "End your reply with 'Score: <number>'.")
SCORE_PATTERN = r"[Ss]core\s*[:=]\s*(-?\d+(?:\.\d+)?)"


class LLMJudge(ModelScorer):
    """Scores each (prompt, response, reference) by asking a judge model with a rubric.

    Arguments: `path` a local causal LM's directory, or `base_url` + `model` an OpenAI-compatible
    endpoint (exactly one of the two); `api_key_env` the environment variable holding the endpoint's
    key; `rubric` the prompt template ({prompt}, {response}, {reference}) or `rubric_file` a file
    holding it (default: a correctness question fitting `verdict`); `verdict` "labels" or "regex";
    `labels` the answers of the labels verdict, the first one scoring 1; `pattern` and `score_range`
    the regex verdict's score and its range; `max_new_tokens` the regex verdict's answer length;
    `batch_size` prompts per call; `max_length` prompt tokens kept (local model); `device` torch
    device; `timeout_s` the longest wait for a call's verdicts; `cache_size` verdicts remembered by
    content hash; `workers` threads (an endpoint: requests in flight); `name` the component's name.
    """

    def __init__(self, *, path: DirectoryPath | None = None, base_url: str | None = None, model: str | None = None,
                 api_key_env: str = "OPENAI_API_KEY", rubric: str | None = None, rubric_file: FilePath | None = None,
                 verdict: Literal["labels", "regex"] = "labels", labels: tuple[str, str] = ("Yes", "No"),
                 pattern: str = SCORE_PATTERN, score_range: tuple[float, float] = (0.0, 10.0),
                 max_new_tokens: int = 32, batch_size: int = 8, max_length: int = 2048, device: str = "cpu",
                 timeout_s: float = 60.0, cache_size: int = 4096, workers: int = 1, name: str = "llm_judge"):
        super().__init__(name=name, batch_size=batch_size, timeout_s=timeout_s, cache_size=cache_size, workers=workers)
        if (path is None) == (base_url is None):
            raise ValueError("path / base_url: give exactly one (a local model directory, or an endpoint)")
        if base_url is not None and not model:
            raise ValueError("model: an endpoint judge needs the model name to ask for")
        if rubric is not None and rubric_file is not None:
            raise ValueError("rubric / rubric_file: give at most one")
        if re.compile(pattern).groups < 1:
            raise ValueError(f"pattern: {pattern!r} needs a group around the score")
        if score_range[1] <= score_range[0]:
            raise ValueError(f"score_range: {score_range} is empty")
        self.backend = (TransformersBackend(existing_dir("path", path), device=device, max_length=max_length)
                        if path is not None else OpenAIBackend(base_url, model, api_key_env=api_key_env,
                                                               timeout_s=timeout_s))
        default = LABELS_RUBRIC if verdict == "labels" else SCORE_RUBRIC
        self.rubric = Path(rubric_file).read_text() if rubric_file is not None else (rubric or default)
        self.verdict, self.labels, self.score_range = verdict, list(labels), score_range
        self.pattern, self.max_new_tokens = re.compile(pattern), max_new_tokens
        self._verdicts = {"labels": self._by_labels, "regex": self._by_regex}

    def _version(self) -> str:
        # Scores depend on the model and on how it is asked: a new rubric is a new scorer version.
        return fingerprint(self.backend.fingerprint(), self.rubric, self.verdict, self.labels, self.pattern.pattern,
                           self.score_range, self.max_new_tokens)

    def load(self) -> None:
        self.backend.load()

    def _score_batch(self, items: list[Item]) -> list[Scored]:
        return self._verdicts[self.verdict]([fill(self.rubric, item) for item in items])

    def _by_labels(self, prompts: list[str]) -> list[Scored]:
        out = []
        for probs in self.backend.label_probs(prompts, self.labels):
            mass = sum(probs.values())
            if mass <= 0.0:
                out.append(Scored(None, UNPARSABLE, f"none of the labels {self.labels} among the judge's answers"))
            else:
                out.append(Scored(probs[self.labels[0]] / mass))
        return out

    def _by_regex(self, prompts: list[str]) -> list[Scored]:
        return [self.parse(text) for text in self.backend.generate(prompts, self.max_new_tokens)]

    def parse(self, text: str) -> Scored:
        """The regex verdict of one answer: its last score, normalised over `score_range`."""
        found = self.pattern.findall(text)
        if not found:
            return Scored(None, UNPARSABLE, f"no score in the judge's answer {text[:200]!r}")
        lo, hi = self.score_range
        value = float(found[-1])
        if not lo <= value <= hi:
            return Scored(None, UNPARSABLE, f"score {value:g} outside {lo:g}..{hi:g} in {text[:200]!r}")
        return Scored((value - lo) / (hi - lo))
