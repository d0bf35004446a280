"""`undertow algorithms`: the algorithm presets, what each sets, and the building blocks they use."""

from __future__ import annotations

import inspect
from typing import Any

from undertow.infra.cli.common import console


def algorithms() -> None:
    """List the algorithm presets (`algorithm: NAME` in a run file) and the settings each makes, then
    every registered advantage, policy loss, aggregation, KL estimator and advantage transform."""
    from undertow.infra.algorithms import presets
    from undertow.processors.advantages import ADVANTAGES
    from undertow.trainer.algorithms import advantage_transforms, aggregations, kl_estimators, policy_losses

    for name in presets.names():
        fn = presets.get(name)
        options = ", ".join(f"{p.name}={p.default!r}" for p in inspect.signature(fn).parameters.values())
        console.print(f"{name}({options}): {inspect.getdoc(inspect.getmodule(fn)).splitlines()[0]}",
                      highlight=False, markup=False, soft_wrap=True)
        for key, value in flat(fn()):
            console.print(f"    {key}: {value}", highlight=False, markup=False, soft_wrap=True)
    blocks = {"advantages (processors.pipeline: reshape's advantage)": ADVANTAGES,
              "policy losses (trainer.algorithm.policy_loss)": policy_losses,
              "aggregations (trainer.algorithm.aggregation)": aggregations,
              "KL estimators (trainer.algorithm.kl.estimator)": kl_estimators,
              "advantage transforms (trainer.algorithm.advantage_transform)": advantage_transforms}
    for title, registry in blocks.items():
        console.print(f"{title}: {', '.join(registry.names())}", highlight=False, markup=False, soft_wrap=True)


def flat(settings: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested sections as dotted keys; a component entry ({name: …}) stays whole."""
    out = []
    for key, value in settings.items():
        if isinstance(value, dict) and "name" not in value:
            out += flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out
