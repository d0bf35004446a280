from __future__ import annotations

import pytest

from schemas.registry import Registry, RegistryError


def shout(text: str, *, times: int = 1) -> str:
    """A plugin found by dotted path."""
    return text.upper() * times


def test_short_name_dotted_path_and_mapping_resolve():
    reg: Registry = Registry("reward")
    reg.register("shout")(shout)
    assert reg.resolve("shout").obj is shout
    comp = reg.resolve({"name": "tests.schemas.test_registry.shout", "times": 2})
    assert comp.obj is shout and comp.kwargs == {"times": 2} and comp.obj("a", **comp.kwargs) == "AA"


def test_unknown_name_lists_the_known_ones():
    reg: Registry = Registry("loss")
    reg.register("ppo")(shout)
    with pytest.raises(RegistryError, match=r"loss 'ppx': unknown; expected one of \['ppo'\]"):
        reg.resolve("ppx")


def test_bad_dotted_path_and_bad_argument_are_named():
    reg: Registry = Registry("processor")
    with pytest.raises(RegistryError, match="cannot import"):
        reg.resolve("no_such_module.fn")
    with pytest.raises(RegistryError, match=r"unexpected argument\(s\) \['tmes'\]; it takes \['times'\]"):
        reg.resolve({"name": "tests.schemas.test_registry.shout", "tmes": 2})


def test_a_name_cannot_be_taken_twice():
    reg: Registry = Registry("x")
    reg.register("a")(shout)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("a")(len)
