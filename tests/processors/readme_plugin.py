# my_lab/filters.py — config: processors: {pipeline: [clean, {name: my_lab.filters.drop_truncated, max_tokens: 2048}, reshape]}
from undertow.processors import Reject, processor
from undertow.schemas import Experience


@processor("drop_truncated")
def drop_truncated(exp: Experience, *, max_tokens: int = 4096) -> Experience | Reject:
    """Cut-off samples go to experiences.rejected instead of into training."""
    if exp.finish_reason == "length" or len(exp.response_tokens) > max_tokens:
        return Reject("truncated", f"{len(exp.response_tokens)} tokens, finish_reason {exp.finish_reason}")
    return exp
