"""How a settings field is spelt on the command line: its flag, help, parser and unit, kept on the field.

A field declared with `option` (or `duration`) carries its one default and a `Flag` in its metadata;
the parser is built by walking those fields (`parser.py`), so no default is written twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, dataclass_transform

from epp import durations
from epp.cliutil import parse_duration, positive_duration, positive_int

T = TypeVar("T")


class _NotSpelt:
    """The flag's default is the field's own (the usual case)."""


NOT_SPELT = _NotSpelt()

FLAG = "flag"  # metadata key: the field's `Flag`
SUB_FLAGS = "sub_flags"  # metadata key: a `Flag` per field of a value type the settings do not own


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line flag; `%(default)s` in `help` reads the field's default as the flag spells it."""

    name: str
    help: str
    parse: Callable[[str], Any] | None = None  # argparse `type`; None: the text as given
    unit: str | None = None  # "s" for durations, "bytes" for sizes: the field name ends with it too
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    # How the default reads in `--help` when the value is not its own spelling (a duration's "100ms").
    shown_default: str | None = None
    # The flag's default where it spells the field's default otherwise (0 for None) or the field has
    # none; a flag left at this value gives the field's default.
    absent: object = NOT_SPELT
    # A flag that gives the same text from a file instead (mutually exclusive with `name`).
    file_flag: str | None = None
    file_help: str = ""

    @property
    def dest(self) -> str:
        """The argparse attribute, as argparse itself derives it from the flag."""
        return dest_of(self.name)


def dest_of(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def option(
    *,
    default: T,
    flag: str,
    help: str,
    parse: Callable[[str], Any] | None = None,
    unit: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    absent: object = NOT_SPELT,
) -> T:
    """A settings field with its default and its flag."""
    spec = Flag(flag, help, parse, unit, metavar, choices, absent=absent)
    return dataclasses.field(default=default, metadata={FLAG: spec})


def duration(
    *,
    default: str,
    flag: str,
    help: str,
    parse: Callable[[str], float] | None = None,
    metavar: str | None = None,
) -> float:
    """A duration field in seconds, its default written as the flag reads it ("100ms", "10m")."""
    spec = Flag(flag, help, parse or positive_duration, "s", metavar, shown_default=default)
    return dataclasses.field(default=durations.parse_duration(default), metadata={FLAG: spec})


def optional_path(
    *, default: pathlib.Path | None, flag: str, help: str, metavar: str | None = None
) -> pathlib.Path | None:
    """An optional file or directory (None: not given)."""
    return option(default=default, flag=flag, help=help, parse=pathlib.Path, metavar=metavar)


def size(*, default: int, flag: str, help: str) -> int:
    """A positive size field in bytes."""
    return option(default=default, flag=flag, help=help, parse=positive_int, unit="bytes")


@dataclass_transform(
    frozen_default=True, field_specifiers=(dataclasses.field, option, duration, optional_path, size)
)
def concern(cls: type[T]) -> type[T]:
    """A frozen settings class whose fields are declared with the helpers above (or `field`)."""
    return dataclass(frozen=True, slots=True)(cls)


def required(flag: str, help: str, *, absent: object) -> dict[str, Flag]:
    """Metadata for a field with no default of its own: `absent` is what the flag holds when not given."""
    return {FLAG: Flag(flag, help, absent=absent)}


# -- value parsers: a bad value is a usage error (exit 2) naming the flag ------------------------------


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from err
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} out of range 0-65535")
    return value


def duration_or_zero(text: str) -> float:
    """Any duration; a negative one counts as zero (no time at all)."""
    return max(0.0, parse_duration(text))


def stripped(text: str) -> str:
    return text.strip()
