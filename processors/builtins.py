"""Importing this module registers every built-in processor."""

from undertow.processors import clean, datajuicer, prioritize, reshape, score  # noqa: F401
