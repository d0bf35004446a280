"""One valid example of every record kind, shared by the codec, Arrow and broker round-trip tests.

Floats in per-token lists are fp32-representable, so they survive the fp32 wire format exactly.
"""

from undertow.schemas import (
    EvalResult,
    Experience,
    MetricEvent,
    PreferencePair,
    Record,
    Rejected,
    Task,
    TaskStat,
    chunk_weights,
)

T0 = 1_700_000_000.25


def make_examples() -> dict[str, Record]:
    experience = Experience(
        experience_id="e-1",
        task_id="t-1",
        group_id="g-1",
        group_size=4,
        sample_index=2,
        prompt_text="What is 2+2?",
        prompt_tokens=[101, 2054, 2003],
        response_text="4",
        response_tokens=[1018, 102, 7],
        behaviour_logprobs=[-0.5, -0.25, -1.5],
        loss_mask=[1, 0, 1],
        reward=1.0,
        reward_components={"correct": 1.0, "format": 0.1},
        advantages=[0.75, -0.125, 0.0],
        policy_version=3,
        token_versions=[3, 4, 3],  # schema v2: a sequence that spans a swap; policy_version is the oldest
        finish_reason="stop",
        timestamps={"generated": T0 + 1, "scored": T0 + 2.5},
        priority=2.5,
        metadata={"engine": "vllm", "turns": 2, "tags": ["easy", None], "nested": {"ok": True}},
    )
    return {
        "task": Task(
            task_id="t-1",
            prompt="What is 2+2?",
            messages=[{"role": "user", "content": "What is 2+2?"}],
            answer="4",
            taskset="arith",
            group_size=4,
            metadata={"source": "hand", "level": 1},
            created_at=T0,
        ),
        "experience": experience,
        "preference_pair": PreferencePair(
            pair_id="p-1",
            task_id="t-1",
            prompt_text="Say hi",
            prompt_tokens=[5, 6],
            chosen_text="hi",
            chosen_tokens=[7],
            rejected_text="go away",
            rejected_tokens=[8, 9],
            chosen_ref_logprob=-1.25,
            rejected_ref_logprob=-7.5,
            policy_version=2,
            metadata={"annotator": "a"},
        ),
        "weight_update": chunk_weights("tiny", 3, b"abcdefgh", 3)[1],
        "metric": MetricEvent(
            component="trainer", values={"loss": 0.25, "kl": 0.01}, step=10, time=T0, labels={"run": "r1"}
        ),
        "task_stat": TaskStat(task_id="t-1", taskset="arith", attempts=8, successes=6, updated_at=T0),
        "rejected": Rejected(
            stage="clean",
            reason="invalid",
            detail="reward: Input should be a finite number",
            original=b"\x81\xa4kind",
            original_key=b"g-1",
            topic="ns.experiences.raw",
            partition=2,
            offset=41,
            record_id="e-9",
            time=T0,
        ),
        "eval": EvalResult(model="tiny", version=10, taskset="sums-heldout", tasks=100, greedy_accuracy=0.75,
                           samples=4, pass_at={"pass@1": 0.5, "pass@4": 0.875}, mean_reward=0.5, mean_response_tokens=2.5,
                           seconds=1.25, time=T0),
    }
