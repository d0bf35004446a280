"""The registry of algorithm presets and how one goes under a run file's sections."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from undertow.kernel.config_io import deep_merge
from undertow.kernel.registry import Registry

Sections = dict[str, Any]  # section name -> its settings, as in a run file
presets: Registry[Callable[..., Sections]] = Registry("algorithm")


def preset(name: str) -> Callable[[Callable[..., Sections]], Callable[..., Sections]]:
    """Decorator: `@preset("grpo")` on a function of the preset's options returning its sections."""
    return presets.register(name)


def expand(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with its `algorithm:` preset laid under its sections: what the file sets explicitly wins,
    mappings merged key by key (a list, such as a pipeline, is replaced whole)."""
    sections = presets.resolve(raw["algorithm"])()
    out = dict(raw)
    for section, settings in sections.items():
        out[section] = deep_merge(settings, raw.get(section) or {})
    return out


def rl(advantage: Any, policy_loss: Any, aggregation: Any, *, kl_coef: float = 0.0, shaping: list[Any] = (),
       dynamic_sampling: bool = False, staleness: int | None = None, kl_estimator: Any = "k3",
       kl_placement: str = "loss", advantage_transform: Any = None) -> Sections:
    """The sections of an RL preset: the processors' reshape and the trainer's algorithm (its
    once-per-step advantage transform, if any; and, for an on-policy one, staleness 0 on both sides)."""
    reshape: dict[str, Any] = {"name": "reshape", "advantage": advantage}
    if shaping:
        reshape["shaping"] = list(shaping)
    if dynamic_sampling:
        reshape["dynamic_sampling"] = True
    sections: Sections = {
        "processors": {"pipeline": ["clean", reshape, "prioritize"]},
        "trainer": {"algorithm": {"objective": "rl", "policy_loss": policy_loss, "aggregation": aggregation,
                                  "kl": {"coef": kl_coef, "estimator": kl_estimator, "placement": kl_placement}}},
    }
    if advantage_transform is not None:
        sections["trainer"]["algorithm"]["advantage_transform"] = advantage_transform
    if staleness is not None:
        sections["trainer"]["batching"] = {"max_staleness": staleness}
        sections["rollout"] = {"max_staleness": staleness}
    return sections
