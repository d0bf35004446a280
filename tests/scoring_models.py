"""Tiny scoring models saved to a directory (no download), and a real HTTP server answering the
OpenAI chat-completions API as a judge would: what the scorer tests, the processors' broker test and
benchmarks/model_scorers.py load."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from undertow.kernel.models.tiny import char_tokenizer


def _config(**kw):
    from transformers import GPT2Config

    tok = char_tokenizer()
    return GPT2Config(vocab_size=len(tok), n_positions=512, n_embd=32, n_layer=1, n_head=2,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **kw)


def reward_model_dir(path: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A one-layer GPT-2 sequence classifier with the tiny character tokenizer, saved at `path`."""
    import torch
    from transformers import GPT2ForSequenceClassification

    torch.manual_seed(seed)
    GPT2ForSequenceClassification(_config(num_labels=num_labels)).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


def judge_dir(path: Path, seed: int = 0) -> Path:
    """A one-layer GPT-2 causal LM with the tiny character tokenizer (and its chat template), saved at `path`."""
    import torch
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    GPT2LMHeadModel(_config()).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


# The endpoint judge's first-token alternatives: Yes 0.6, No 0.2, Maybe 0.2 for a response holding
# "42", else Yes 0.1, No 0.9. The labels verdict is then 0.6 / (0.6 + 0.2) = 0.75, or 0.1.
RIGHT_LOGPROBS = {"Yes": math.log(0.6), "No": math.log(0.2), "Maybe": math.log(0.2)}
WRONG_LOGPROBS = {"Yes": math.log(0.1), "No": math.log(0.9)}


class JudgeServer:
    """An OpenAI-compatible chat-completions endpoint on localhost, deciding by the prompt's text:
    "42" in it: "Score: 7" (else "Score: 2"); "garbage": an answer with no score; "slow": the answer
    comes after `slow_s` seconds. `requests` counts the completions asked for; `slow_windows` holds
    the (start, end) unix times of each slow answer."""

    def __init__(self, slow_s: float = 3.0):
        self.requests, self.slow_s = 0, slow_s
        self.slow_windows: list[tuple[float, float]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the client reuses its connections

            def do_POST(self) -> None:  # noqa: N802 — http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests += 1
                reply = server.answer(body)
                data = json.dumps(reply).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    pass

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, body: dict) -> dict:
        prompt = body["messages"][-1]["content"]
        if "slow" in prompt:
            start = time.time()
            time.sleep(self.slow_s)
            self.slow_windows.append((start, time.time()))
        right = "42" in prompt
        logprobs = None
        if body.get("logprobs"):
            alts = RIGHT_LOGPROBS if right else WRONG_LOGPROBS
            top = [{"token": t, "logprob": lp, "bytes": None} for t, lp in alts.items()]
            logprobs = {"content": [{**top[0], "top_logprobs": top}]}
            content = top[0]["token"]
        else:
            content = "I cannot tell." if "garbage" in prompt else f"Reasoning... Score: {7 if right else 2}"
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "logprobs": logprobs, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    def __enter__(self) -> "JudgeServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
