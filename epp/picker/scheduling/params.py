"""Typed, strict access to a plugin's free-form `parameters` object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.errors import ConfigError


class Params:
    """Reads parameters by name with type checks; `done()` rejects any name never read."""

    def __init__(self, plugin_name: str, raw: Mapping[str, Any] | None) -> None:
        if raw is not None and not isinstance(raw, Mapping):
            raise ConfigError(
                f"plugin {plugin_name!r}: parameters must be a mapping, got {type(raw).__name__}"
            )
        self._plugin = plugin_name
        self._raw: Mapping[str, Any] = raw or {}
        self._read: set[str] = set()

    def _get(self, key: str) -> Any:
        self._read.add(key)
        return self._raw.get(key)

    def number(
        self, key: str, default: float, *, minimum: float | None = None, maximum: float | None = None
    ) -> float:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"plugin {self._plugin!r}: parameter {key!r} must be a number, got {value!r}")
        number = float(value)
        if minimum is not None and number < minimum:
            raise ConfigError(
                f"plugin {self._plugin!r}: parameter {key!r} must be ≥ {minimum}, got {value!r}"
            )
        if maximum is not None and number > maximum:
            raise ConfigError(
                f"plugin {self._plugin!r}: parameter {key!r} must be ≤ {maximum}, got {value!r}"
            )
        return number

    def integer(self, key: str, default: int, *, minimum: int | None = None) -> int:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"plugin {self._plugin!r}: parameter {key!r} must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ConfigError(
                f"plugin {self._plugin!r}: parameter {key!r} must be ≥ {minimum}, got {value!r}"
            )
        return value

    def optional_integer(self, key: str, *, minimum: int | None = None) -> int | None:
        if self._raw.get(key) is None:
            self._read.add(key)
            return None
        return self.integer(key, 0, minimum=minimum)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(
                f"plugin {self._plugin!r}: parameter {key!r} must be true or false, got {value!r}"
            )
        return value

    def raw_items(self) -> dict[str, float | int | bool | str | None]:
        """Every parameter as given (scalars only), for plugins that pass them on; marks all read."""
        out: dict[str, float | int | bool | str | None] = {}
        for key, value in self._raw.items():
            self._read.add(key)
            if value is None or isinstance(value, bool | int | float | str):
                out[str(key)] = value
            else:
                raise ConfigError(
                    f"plugin {self._plugin!r}: parameter {key!r} must be a scalar, got {value!r}"
                )
        return out

    def raw_value(self, key: str) -> Any:
        """The parameter as given (None when absent), for types parsed elsewhere (durations)."""
        return self._get(key)

    def accept(self, *keys: str) -> None:
        """Known upstream parameters we accept and ignore."""
        self._read.update(keys)

    def done(self) -> None:
        unknown = sorted(set(self._raw) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read)) or "none"
            raise ConfigError(
                f"plugin {self._plugin!r}: unknown parameter(s) {', '.join(unknown)} (known: {known})"
            )
