"""Tools for the tests, in a module that imports nothing heavy: a tool's child process imports it by name."""

from __future__ import annotations


def hang(seconds: float = 60.0) -> str:
    """Sleep far past any timeout.

    Args:
        seconds: how long to sleep
    """
    import time
    time.sleep(seconds)
    return "woke up"


def hog(megabytes: int = 2048) -> str:
    """Allocate far more memory than a tool is allowed.

    Args:
        megabytes: how much to allocate
    """
    block = bytearray(megabytes * 2 ** 20)
    return str(len(block))


def boom(text: str) -> str:
    """Raise.

    Args:
        text: the message of the error
    """
    raise RuntimeError(text)


def no_docstring(x: int) -> str:
    return str(x)
