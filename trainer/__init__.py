"""trainer — the DeepSpeed trainer: consumes `experiences.ready`, learns, broadcasts weights.

`undertow train CONFIG` (infra/cli/trainer.py) calls `trainer.runner.run`. Algorithms live in
`trainer.algorithms` (registries of small functions); nothing outside `ready_intake.py` and `runner.py`
knows about Kafka.
"""
