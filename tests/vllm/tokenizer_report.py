"""What a model's tokenizer does to the probe texts, in whichever environment runs it:

    python -m tests.vllm.tokenizer_report < [SPEC, ...]

prints one report per spec (kernel/models/tokenizer.py's encodings, the probes decoded back, the
fingerprint), so that the vLLM environment's tests can set the main environment's beside their own.
"""

from __future__ import annotations

import json
import sys


def report(model: dict) -> dict:
    """`model`: a ModelSpec's fields."""
    from undertow.kernel.models import ModelSpec, build_tokenizer, fingerprint
    from undertow.kernel.models.tokenizer import encodings

    tok = build_tokenizer(ModelSpec(**model))
    found = encodings(tok)
    return {"class": type(tok).__name__, "encodings": found, "decoded": [tok.decode(ids) for ids in found["plain"]],
            "fingerprint": fingerprint(tok)}


if __name__ == "__main__":
    print(json.dumps([report(model) for model in json.load(sys.stdin)]))
