"""Importing this module registers every built-in processor."""

from undertow.processors import clean, datajuicer, distill, prioritize, reshape, score, scorers  # noqa: F401
