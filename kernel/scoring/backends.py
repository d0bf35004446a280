"""Where an LLM judge's answers come from: a local causal LM (transformers), or any OpenAI-compatible endpoint.

A backend turns judge prompts (the rubric, filled) into either generated text or the probabilities
of label tokens as the first token of the answer. Each prompt is one user turn: a local model's chat
template wraps it when the tokenizer has one; an endpoint gets it as a chat message.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from undertow.kernel.scoring.base import dir_fingerprint, fingerprint


class TransformersBackend:
    """A causal LM read from the local directory `path`, run with torch on `device`."""

    def __init__(self, path: Path, *, device: str = "cpu", max_length: int = 2048):
        self.path, self.device, self.max_length = path, device, max_length
        self.model: Any = None
        self.tokenizer: Any = None

    def fingerprint(self) -> str:
        return dir_fingerprint(self.path)

    def load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.path)
        tok.padding_side, tok.truncation_side = "left", "left"  # the prompt's end is where the answer starts
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        self.tokenizer, self.model = tok, AutoModelForCausalLM.from_pretrained(self.path).to(self.device).eval()

    def _encode(self, prompts: list[str]) -> dict[str, Any]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                             add_generation_prompt=True) for p in prompts]
        else:
            texts = prompts
        batch = tok(texts, padding=True, truncation=True, max_length=self.max_length, add_special_tokens=False,
                    return_tensors="pt").to(self.device)
        # Left padding shifts positions: count them from each row's first real token.
        batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        return batch

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy answers (a verdict should not depend on a sampling seed)."""
        import torch

        batch = self._encode(prompts)
        batch.pop("position_ids")  # generate derives them from the attention mask itself
        with torch.no_grad():
            out = self.model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id)
        new = out[:, batch["input_ids"].shape[1]:]  # [B, <= max_new_tokens]
        return self.tokenizer.batch_decode(new, skip_special_tokens=True)

    def label_probs(self, prompts: list[str], labels: list[str]) -> list[dict[str, float]]:
        """P(first token of each label) as the answer's first token, per prompt."""
        import torch

        ids = [self.tokenizer.encode(label, add_special_tokens=False)[0] for label in labels]
        if len(set(ids)) != len(ids):
            raise ValueError(f"labels {labels} begin with the same token: the judge cannot tell them apart")
        with torch.no_grad():
            logits = self.model(**self._encode(prompts)).logits[:, -1].float()  # [B, V]: the next token
        probs = logits.softmax(-1)[:, ids]  # [B, n_labels]
        return [dict(zip(labels, row)) for row in probs.tolist()]


class OpenAIBackend:
    """Chat completions from an OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp, OpenAI) with the
    `openai` client; the key is read from the environment variable `api_key_env` (never from config)."""

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60.0,
                 top_logprobs: int = 20):
        self.base_url, self.model, self.api_key_env = base_url, model, api_key_env
        self.timeout_s, self.top_logprobs = timeout_s, top_logprobs
        self.client: Any = None

    def fingerprint(self) -> str:
        return fingerprint(self.base_url.rstrip("/"), self.model)

    def load(self) -> None:
        from openai import OpenAI

        # No retries: a slow judge is a timeout for the caller to handle, not a reason to wait longer.
        self.client = OpenAI(base_url=self.base_url, api_key=os.environ.get(self.api_key_env, "EMPTY"),
                             timeout=self.timeout_s, max_retries=0)

    def _ask(self, create: Any, **kw: Any) -> Any:
        from openai import APITimeoutError

        try:
            return create(model=self.model, temperature=0.0, **kw)
        except APITimeoutError as e:
            # The client's timeout is the caller's own deadline (`timeout_s`): whichever clock fires first,
            # the verdict is a timeout, not an error (ModelScorer reads a TimeoutError as one).
            raise TimeoutError(f"{self.base_url}: no answer within {self.timeout_s:g} s") from e

    def _chat(self, prompt: str, **kw: Any) -> Any:
        return self._ask(self.client.chat.completions.create, messages=[{"role": "user", "content": prompt}], **kw)

    def token_logprobs(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        """log p(token | the tokens before it) of each sequence's tokens from `starts[i]` on, as the served
        model reads them at its own temperature (1): one completions request with token ids as prompts,
        `echo` and `logprobs` on; the one token each must generate is not read."""
        out = self._ask(self.client.completions.create, prompt=sequences, max_tokens=1, echo=True, logprobs=0)
        result = []
        for seq, start, choice in zip(sequences, starts, sorted(out.choices, key=lambda c: c.index)):
            echoed = choice.logprobs.token_logprobs if choice.logprobs else []  # [None, lp(t1), ..., lp(new)]
            if len(echoed) < len(seq):
                raise ValueError(f"{self.base_url} echoed {len(echoed)} log-probs for {len(seq)} prompt tokens: "
                                 f"it does not return the prompt's log-probs (completions `echo` with `logprobs`)")
            result.append([float(lp) for lp in echoed[start:len(seq)]])
        return result

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        return [self._chat(p, max_tokens=max_new_tokens).choices[0].message.content or "" for p in prompts]

    def label_probs(self, prompts: list[str], labels: list[str]) -> list[dict[str, float]]:
        """The labels' probabilities among the first answer token's top log-probs (0 when absent)."""
        out = []
        for p in prompts:
            choice = self._chat(p, max_tokens=1, logprobs=True, top_logprobs=self.top_logprobs).choices[0]
            first = choice.logprobs.content[0].top_logprobs if choice.logprobs and choice.logprobs.content else []
            probs = dict.fromkeys(labels, 0.0)
            for alt in first:
                token = alt.token.strip()
                if token in probs:  # " Yes" and "Yes" are the same verdict
                    probs[token] += math.exp(alt.logprob)
            out.append(probs)
        return out
