from __future__ import annotations

import pytest

from undertow.kernel.registry import Registry, RegistryError, checked_entry


def shout(text: str, *, times: int = 1) -> str:
    """A plugin found by dotted path."""
    return text.upper() * times


def test_short_name_dotted_path_and_mapping_resolve():
    reg: Registry = Registry("reward")
    reg.register("shout")(shout)
    assert reg.resolve("shout").obj is shout
    comp = reg.resolve({"name": "tests.kernel.test_registry.shout", "times": 2})
    assert comp.obj is shout and comp.kwargs == {"times": 2} and comp.obj("a", **comp.kwargs) == "AA"


def test_unknown_name_lists_the_known_ones():
    reg: Registry = Registry("loss")
    reg.register("ppo")(shout)
    with pytest.raises(RegistryError, match=r"loss 'ppx': unknown \(did you mean 'ppo'\?\); expected one of \['ppo'\]"):
        reg.resolve("ppx")


def test_bad_dotted_path_and_bad_argument_are_named():
    reg: Registry = Registry("processor")
    with pytest.raises(RegistryError, match="cannot import"):
        reg.resolve("no_such_module.fn")
    with pytest.raises(RegistryError, match=r"unexpected argument\(s\) \['tmes'\] \(did you mean 'times'\?\); it takes \['times'\]"):
        reg.resolve({"name": "tests.kernel.test_registry.shout", "tmes": 2})


def test_a_name_cannot_be_taken_twice():
    reg: Registry = Registry("x")
    reg.register("a")(shout)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("a")(len)


class Counter:
    """A stateful plugin: one instance per resolved entry."""

    def __init__(self, *, start: int = 0):
        self.n = start

    def __call__(self) -> int:
        self.n += 1
        return self.n


def test_a_component_binds_a_function_builds_a_class_once_and_calls_with_its_arguments():
    reg: Registry = Registry("thing")
    reg.register("shout")(shout)
    reg.register("counter")(Counter)
    bound = reg.resolve({"name": "shout", "times": 3}).bind()
    assert bound("a") == "AAA" and bound("b", times=1) == "B"
    counter = reg.resolve({"name": "counter", "start": 10}).bind()
    assert isinstance(counter, Counter) and [counter(), counter()] == [11, 12]  # one instance, its state kept
    factory = reg.resolve({"name": "counter", "start": 5})
    assert factory() is not factory() and factory().n == 5  # calling the component builds a fresh one
    assert reg.resolve({"name": "shout", "times": 2})("x") == "XX"


def test_checked_entry_passes_a_good_entry_through_and_names_a_bad_one():
    reg: Registry = Registry("loss")
    reg.register("shout")(shout)
    assert checked_entry(reg, {"name": "shout", "times": 2}) == {"name": "shout", "times": 2}
    with pytest.raises(ValueError, match=r"loss 'shout': unexpected argument\(s\) \['loud'\]"):
        checked_entry(reg, {"name": "shout", "loud": True})


def test_an_argument_of_the_wrong_type_is_refused_when_resolved():
    """Types are checked as the config's own fields are (lax: 2 is a float), before anything is built."""
    reg: Registry = Registry("reward")
    reg.register("shout")(shout)
    with pytest.raises(RegistryError, match=r"reward 'shout': argument times = 'twice': .*valid integer"):
        reg.resolve({"name": "shout", "times": "twice"})
    with pytest.raises(RegistryError, match=r"argument times = 2.5: .*fractional part"):
        reg.resolve({"name": "shout", "times": 2.5})
    assert reg.resolve({"name": "shout", "times": 2}).bind()("a") == "AA"
    reg.register("counter")(Counter)  # a class: its __init__'s annotations
    with pytest.raises(RegistryError, match=r"counter'?: argument start = \[1\]"):
        reg.resolve({"name": "counter", "start": [1]})


def scale(values: "NotImportedHere", *, factor: float = 1.0) -> float:  # noqa: F821 — stands for a loss's torch.Tensor
    return factor


def test_an_argument_is_checked_though_another_parameters_annotation_does_not_resolve():
    """Only the annotations of the arguments the config gives are evaluated: a loss's tensor parameter
    (named after a lazily imported torch) neither blocks the check nor imports torch to make it."""
    reg: Registry = Registry("loss")
    reg.register("scale")(scale)
    with pytest.raises(RegistryError, match=r"loss 'scale': argument factor = 'big'"):
        reg.resolve({"name": "scale", "factor": "big"})
    assert reg.resolve({"name": "scale", "factor": 2}).kwargs == {"factor": 2}
