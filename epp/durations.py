"""Go-style durations (`50ms`, `2s`, `1m30s`), as upstream's flags and config files write them."""

from __future__ import annotations

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class DurationError(ValueError):
    """Text that is not a duration; the message says what is wrong with it."""


def parse_duration(text: str) -> float:
    """`50ms`, `2s`, `1m30s` or a bare number (seconds) → seconds."""
    s = text.strip()
    try:
        return float(s)
    except ValueError:
        pass
    if not s:
        raise DurationError("empty duration")
    total = 0.0
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and (s[j].isdigit() or s[j] == "."):
            j += 1
        if j == i:
            raise DurationError(f"invalid duration {text!r}")
        number = float(s[i:j])
        k = j
        while k < len(s) and not (s[k].isdigit() or s[k] == "."):
            k += 1
        unit = s[j:k]
        if unit not in _UNITS:
            raise DurationError(f"invalid duration unit {unit!r} in {text!r}")
        total += number * _UNITS[unit]
        i = k
    return total
