"""A reward model: `AutoModelForSequenceClassification` from a local directory scoring prompt + response."""

from __future__ import annotations

from typing import Any

from pydantic import DirectoryPath

from undertow.kernel.scoring.base import Item, ModelScorer, Scored, dir_fingerprint, existing_dir


class RewardModelScorer(ModelScorer):
    """Scores each (prompt, response) with a sequence-classification model read from `path`.

    Arguments: `path` the model directory (config, weights, tokenizer); `batch_size` responses per
    forward pass; `max_length` tokens kept per text (from the end: the response matters most);
    `device` torch device ("cpu"); `label` which logit is the reward when the model has several
    (their softmax probability; a one-label model's raw logit is the reward, as TRL's reward models);
    `chat_template` format prompt and response as a user and an assistant turn when the tokenizer has
    a template (else prompt + response); `timeout_s` the longest wait for a call's verdicts;
    `cache_size` verdicts remembered by content hash; `workers` threads scoring chunks in parallel;
    `name` the reward component's name.
    """

    def __init__(self, *, path: DirectoryPath, batch_size: int = 8, max_length: int = 1024, device: str = "cpu",
                 label: int = -1, chat_template: bool = True, timeout_s: float = 60.0, cache_size: int = 4096,
                 workers: int = 1, name: str = "reward_model"):
        super().__init__(name=name, batch_size=batch_size, timeout_s=timeout_s, cache_size=cache_size, workers=workers)
        self.path = existing_dir("path", path)
        self.max_length, self.device, self.label, self.chat_template = max_length, device, label, chat_template
        self.model: Any = None
        self.tokenizer: Any = None

    def _version(self) -> str:
        return dir_fingerprint(self.path)

    def load(self) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.path)
        tok.padding_side, tok.truncation_side = "right", "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(self.path).to(self.device).eval()
        if model.config.pad_token_id is None:  # needed to find each row's last real token
            model.config.pad_token_id = tok.pad_token_id
        self.tokenizer, self.model = tok, model

    def text(self, item: Item) -> str:
        """What the model reads: the chat-formatted conversation, or prompt + response."""
        if self.chat_template and getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": item.prompt}, {"role": "assistant", "content": item.response}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return item.prompt + item.response

    def _score_batch(self, items: list[Item]) -> list[Scored]:
        import torch

        batch = self.tokenizer([self.text(i) for i in items], padding=True, truncation=True,
                               max_length=self.max_length, return_tensors="pt").to(self.device)
        with torch.no_grad():
            logits = self.model(**batch).logits.float()  # [B, num_labels]
        if logits.shape[-1] == 1:
            values = logits[:, 0]
        else:
            values = logits.softmax(-1)[:, self.label]
        return [Scored(float(v)) for v in values.tolist()]

