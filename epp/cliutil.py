"""Small argparse helpers shared by every subcommand."""

from __future__ import annotations

import argparse

_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


def parse_bool(text: str) -> bool:
    """Go-flag style booleans: `--flag`, `--flag=true`, `--flag=false`."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_bool_flag(parser: argparse.ArgumentParser, flag: str, *, default: bool, help: str) -> None:
    """A boolean flag that accepts a bare `--flag` (true) and `--flag=false`, as upstream's Go flags do."""
    parser.add_argument(
        flag,
        nargs="?",
        const=True,
        default=default,
        type=parse_bool,
        metavar="BOOL",
        help=f"{help} (default {str(default).lower()})",
    )


def parse_duration(text: str) -> float:
    """Go-style durations (`50ms`, `2s`, `1m30s`, `1.5`) → seconds; a bare number is seconds."""
    s = text.strip()
    try:
        return float(s)
    except ValueError:
        pass
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    total = 0.0
    i = 0
    if not s:
        raise argparse.ArgumentTypeError("empty duration")
    while i < len(s):
        j = i
        while j < len(s) and (s[j].isdigit() or s[j] == "."):
            j += 1
        if j == i:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r}")
        number = float(s[i:j])
        k = j
        while k < len(s) and not (s[k].isdigit() or s[k] == "."):
            k += 1
        unit = s[j:k]
        if unit not in units:
            raise argparse.ArgumentTypeError(f"invalid duration unit {unit!r} in {text!r}")
        total += number * units[unit]
        i = k
    return total
