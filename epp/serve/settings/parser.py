"""The `epp serve` parser, built by walking the settings tree, and the tree built back from its flags.

Each concern of `ServeSettings` is one argument group; each field gives its flag, parser, help and
default from its `Flag`, so `--help` and the settings cannot disagree about a default.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import typing
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass
from typing import Any

from epp.cliutil import add_bool_flag
from epp.errors import ConfigError
from epp.serve.settings.flags import FLAG, NOT_SPELT, SUB_FLAGS, Flag, dest_of
from epp.serve.settings.tree import GROUP, ServeSettings


@dataclass(frozen=True, slots=True)
class Option:
    """One flag and where its value lands: `ServeSettings.<concern>.<field>`, or a `<part>` of it."""

    group: str  # the concern's argument group
    concern: str
    field: str
    part: str | None  # a field of a value type the settings do not own (`MetricNames`)
    flag: Flag
    default: object  # the field's (or part's) default; MISSING where it has none

    @property
    def flag_default(self) -> object:
        """What the flag holds when it is not given."""
        return self.default if self.flag.absent is NOT_SPELT else self.flag.absent


def concerns() -> Iterator[tuple[dataclasses.Field[Any], type[Any]]]:
    """`ServeSettings`' members, each with its concern's dataclass."""
    hints = typing.get_type_hints(ServeSettings)
    for member in dataclasses.fields(ServeSettings):
        yield member, hints[member.name]


def options() -> Iterator[Option]:
    """Every flag of the tree, concern by concern, in declaration order."""
    for member, node in concerns():
        group = member.metadata[GROUP]
        for leaf in dataclasses.fields(node):
            if FLAG in leaf.metadata:
                yield Option(group, member.name, leaf.name, None, leaf.metadata[FLAG], leaf.default)
            for part, flag in leaf.metadata.get(SUB_FLAGS, {}).items():
                yield Option(group, member.name, leaf.name, part, flag, getattr(leaf.default, part))


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Every `epp serve` flag, with upstream's names and defaults unless the help says otherwise."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option in options():
        if option.group not in groups:
            groups[option.group] = parser.add_argument_group(option.group)
        _add_flag(groups[option.group], option)


def _add_flag(group: argparse._ActionsContainer, option: Option) -> None:
    flag, default = option.flag, option.flag_default
    if flag.file_flag is not None:
        group = group.add_mutually_exclusive_group()
        group.add_argument(flag.file_flag, type=pathlib.Path, default=None, help=flag.file_help)
    if isinstance(default, bool):
        add_bool_flag(group, flag.name, default=default, help=flag.help)
        return
    help_text = flag.help
    if flag.shown_default is not None:
        help_text = help_text.replace("%(default)s", flag.shown_default)
    group.add_argument(
        flag.name,
        dest=flag.dest,
        type=flag.parse or str,
        default=default,
        metavar=flag.metavar,
        choices=flag.choices,
        help=help_text,
    )


def settings_from_flags(args: argparse.Namespace) -> ServeSettings:
    """The tree as the flags give it, before the environment and the cross-field checks."""
    values: dict[str, dict[str, Any]] = defaultdict(dict)
    parts: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    for option in options():
        value = _value(args, option)
        if option.part is None:
            values[option.concern][option.field] = value
        else:
            parts[option.concern, option.field][option.part] = value
    nodes = {member.name: node for member, node in concerns()}
    for (concern, name), chosen in parts.items():
        values[concern][name] = _with_parts(nodes[concern], name, chosen)
    return ServeSettings(**{member.name: node(**values[member.name]) for member, node in concerns()})


def _value(args: argparse.Namespace, option: Option) -> object:
    flag = option.flag
    value = getattr(args, flag.dest)
    if flag.file_flag is not None and getattr(args, dest_of(flag.file_flag)) is not None:
        value = _read(flag.file_flag, getattr(args, dest_of(flag.file_flag)))
    if flag.absent is not NOT_SPELT and value == flag.absent and option.default is not MISSING:
        return option.default
    return value


def _read(flag: str, path: pathlib.Path) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise ConfigError(f"{flag} {path}: {err.strerror}") from err


def _with_parts(node: type[Any], name: str, chosen: Mapping[str, object]) -> object:
    """The field's default value with the parts the flags chose; its own checks are config errors."""
    (default,) = (f.default for f in dataclasses.fields(node) if f.name == name)
    try:
        return dataclasses.replace(typing.cast(Any, default), **chosen)
    except ValueError as err:
        raise ConfigError(str(err)) from err
