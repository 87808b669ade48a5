"""Small argparse helpers shared by every subcommand."""

from __future__ import annotations

import argparse

from epp import durations

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


def add_bool_flag(container: argparse._ActionsContainer, flag: str, *, default: bool, help: str) -> None:
    """A boolean flag that accepts a bare `--flag` (true) and `--flag=false`, as upstream's Go flags do.

    `container` is a parser or one of its argument groups, so the flag is listed with its group.
    """
    container.add_argument(
        flag,
        nargs="?",
        const=True,
        default=default,
        type=parse_bool,
        metavar="BOOL",
        help=f"{help} (default {str(default).lower()})",
    )


def parse_duration(text: str) -> float:
    """`epp.durations.parse_duration` as an argparse type: a bad duration is a usage error."""
    try:
        return durations.parse_duration(text)
    except durations.DurationError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from err
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive, got {text!r}")
    return value


def non_negative_duration(text: str) -> float:
    value = parse_duration(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"duration must be zero or positive, got {text!r}")
    return value
