"""Option values the command line (and the pytest plugin) parse: timeouts, counts and
``--patch-map NAME=FUNCTION`` mappings; a bad one is a ``ValueError`` or argparse error naming it."""

from __future__ import annotations

import argparse
import math

__all__ = ["parse_mapping", "positive", "seconds"]


def seconds(text: str) -> float:
    """A timeout: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def parse_mapping(items: list[str]) -> dict[str, str]:
    mapping = {}
    for item in items:
        name, sep, func = item.partition("=")
        if not sep or not name or not func:
            raise ValueError(f"--patch-map expects NAME=FUNCTION, got {item!r}")
        mapping[name] = func
    return mapping
