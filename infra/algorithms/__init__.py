"""Algorithms as named wholes: `algorithm: grpo` in a run file sets, in one place, what the
processors compute (advantage, shaping, filters) and what the trainer minimises (loss, aggregation,
KL, staleness). Each preset is one file here with its paper's equations; the registries of
advantages (processors/advantages.py) and losses (trainer/algorithms/) stay the building blocks.

A preset is a function of its own options returning section overrides; a run file's explicit
settings override it (`undertow config show` prints the result), and `undertow algorithms` lists
them. A user's preset is the same kind of function, named by dotted path.
"""

from undertow.infra.algorithms.preset import expand, preset, presets
from undertow.infra.algorithms import (  # noqa: F401  (registers the built-in presets)
    asymre, cispo, clip_cov, dapo, dppo, dr_grpo, gmpo, gpg, grpo, gspo, kl_cov, on_policy_distill, opmd, opo, pass_k,
    ppo, reinforce, reinforce_pp, reinforce_pp_baseline, remax, rloo, sapo,
)

__all__ = ["expand", "preset", "presets"]
