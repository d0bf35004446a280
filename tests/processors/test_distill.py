"""On-policy distillation's stage without a broker: the teacher's per-token log-probs of the student's
own tokens, against log-probs computed apart (one sequence at a time, no padding) and against
Trinity-RFT's on_policy_distill advantage formula."""

from __future__ import annotations

import pytest
import torch

from undertow.kernel.models import ModelSpec, build_model, build_tokenizer, fingerprint
from undertow.processors.api import Reject
from undertow.processors.distill import Distill

from tests.trainer.helpers import SPEC, behaviour_logprobs, make_group

TEACHER = {"seed": 1}  # the tiny model, another initialisation: it likes other tokens than the student


def trinity_on_policy_distill(old_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, response_mask: torch.Tensor,
                              kl_coef: float) -> torch.Tensor:
    """Trinity-RFT 0.6's OnPolicyDistillAdvantage."""
    return kl_coef * (teacher_log_probs - old_log_probs) * response_mask


def test_the_advantage_is_the_teachers_log_prob_over_the_students_per_token():
    group = make_group("g", size=4)  # behaviour log-probs of the seed-0 student
    group[1] = group[1].model_copy(update={"loss_mask": [1, 0][: len(group[1].response_tokens)] +
                                           [1] * (len(group[1].response_tokens) - 2)})
    out = Distill(teacher=TEACHER, coef=0.5).process_batch(group)
    teacher = build_model(ModelSpec(**TEACHER))
    for exp, distilled in zip(group, out):
        apart = behaviour_logprobs(exp.prompt_tokens, exp.response_tokens, teacher)  # one sequence, no padding
        mask = torch.tensor(exp.loss_mask or [1] * len(exp.response_tokens), dtype=torch.float64)
        trinity = trinity_on_policy_distill(torch.tensor(exp.behaviour_logprobs, dtype=torch.float64),
                                            torch.tensor(apart, dtype=torch.float64), mask, 0.5)
        # Padding the batch changes no logit beyond fp32 rounding over the model's few ops: 1e-5.
        assert distilled.advantages == pytest.approx(trinity.tolist(), abs=1e-5)
        kl = -(trinity / 0.5).sum().item() / mask.sum().item()
        assert distilled.metadata["teacher_kl"] == pytest.approx(kl, abs=1e-5)
    assert out[1].advantages[1] == 0.0  # an observation token: not the student's, not distilled
    # Independent of schemas/logprobs.py, which both sides above share: log_softmax of the teacher's own
    # logits, read by hand at each response token's position (the token at t is predicted at t − 1).
    exp = group[0]
    ids = torch.tensor([exp.prompt_tokens + exp.response_tokens])
    with torch.no_grad():
        logits = teacher(input_ids=ids).logits[0].double()  # [T, V]
    start = len(exp.prompt_tokens)
    by_hand = [torch.log_softmax(logits[start + j - 1], -1)[token].item() for j, token in enumerate(exp.response_tokens)]
    assert out[0].advantages == pytest.approx([0.5 * (t - s) for t, s in zip(by_hand, exp.behaviour_logprobs)], abs=1e-5)


def test_a_teacher_equal_to_the_student_teaches_nothing_and_add_keeps_the_outcome_advantage():
    group = make_group("g", size=2)
    same = Distill(teacher={}, mode="add").process_batch(group)  # the seed-0 model: the student itself
    assert [e.advantages for e in same] == [pytest.approx(e.advantages, abs=1e-5) for e in group]
    assert all(abs(e.metadata["teacher_kl"]) < 1e-5 for e in same)
    replaced = Distill(teacher={}).process_batch(group)
    assert all(a == pytest.approx(0.0, abs=1e-5) for e in replaced for a in e.advantages)


def test_a_record_of_another_tokenizer_or_without_log_probs_is_rejected():
    good, other, bare = make_group("g", size=3)
    other = other.model_copy(update={"metadata": {"tokenizer": "0123456789ab"}})
    bare = bare.model_copy(update={"behaviour_logprobs": []})
    stamped = good.model_copy(update={"metadata": {"tokenizer": fingerprint(build_tokenizer(SPEC))}})
    out = Distill(teacher=TEACHER).process_batch([stamped, other, bare])
    assert not isinstance(out[0], Reject)
    assert isinstance(out[1], Reject) and out[1].reason == "tokenizer_mismatch"
    assert isinstance(out[2], Reject) and out[2].reason == "no_logprobs"


def test_a_bad_teacher_or_coefficient_fails_the_config_naming_the_field():
    from undertow.infra.run.config import RunConfig

    with pytest.raises(ValueError, match=r"(?s)processors.pipeline.*model source 'nope': unknown"):
        RunConfig.model_validate({"processors": {"pipeline": ["clean", {"name": "distill", "teacher": {"source": "nope"}}]}})
    with pytest.raises(ValueError, match="coef"):
        Distill(teacher={}, coef=0.0)
    with pytest.raises(ValueError, match=r"teacher.init_from: /nowhere/hf does not exist"):
        Distill(teacher={"init_from": "/nowhere/hf"})


def test_an_endpoint_teacher_refuses_a_temperature_it_cannot_give_and_names_missing_fields():
    with pytest.raises(ValueError, match="temperature: an endpoint teacher gives its model's log-probs at temperature"):
        Distill(teacher={}, endpoint={"base_url": "http://127.0.0.1:1/v1", "model": "t"}, temperature=0.7)
    with pytest.raises(ValueError, match="endpoint: needs base_url and model"):
        Distill(teacher={}, endpoint={"base_url": "http://127.0.0.1:1/v1"})
    with pytest.raises(ValueError, match="endpoint: .*unexpected keyword argument 'nope'"):
        Distill(teacher={}, endpoint={"base_url": "http://127.0.0.1:1/v1", "model": "t", "nope": 1})
    # Served elsewhere: its weights need no local file (only its tokenizer is read here).
    Distill(teacher={"init_from": "/nowhere/hf"}, endpoint={"base_url": "http://127.0.0.1:1/v1", "model": "t"})


def test_an_endpoint_teacher_that_is_gone_or_silent_rejects_the_batch_with_its_reason():
    """Real sockets: one refusing connections, one accepting them and never answering. (The log-probs
    an endpoint gives are checked against vLLM's server in tests/vllm/test_distill_endpoint.py.)"""
    import socket

    group = make_group("g", size=3)
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        port = gone.getsockname()[1]  # closed on leaving: nothing listens there
    out = Distill(teacher={}, batch_size=2, endpoint={"base_url": f"http://127.0.0.1:{port}/v1", "model": "t"}
                  ).process_batch(group)
    assert [r.reason for r in out] == ["teacher_error"] * 3, out
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads the request
        stage = Distill(teacher={}, endpoint={"base_url": f"http://127.0.0.1:{silent.getsockname()[1]}/v1",
                                              "model": "t", "timeout_s": 0.5})
        out = stage.process_batch(group)
    assert [r.reason for r in out] == ["teacher_timeout"] * 3, out
    assert "no answer within 0.5 s" in out[0].detail
