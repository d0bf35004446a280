"""Importing this module registers every built-in processor."""

from processors import clean, datajuicer, prioritize, reshape, score  # noqa: F401
