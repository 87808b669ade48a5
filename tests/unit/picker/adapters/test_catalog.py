"""The adapter catalogue file: parsed strictly, re-read when the mounted ConfigMap changes,
and a bad edit keeps the last good catalogue."""

from __future__ import annotations

import os
import pathlib

import pytest

from epp.errors import ConfigError
from epp.picker.adapters.catalog import Catalog, FileCatalog, parse_catalog


def test_round_trip() -> None:
    catalog = Catalog({"legal": "org/legal-lora", "code": "/mnt/pvc/x/code"}, "all")
    assert parse_catalog(catalog.to_yaml()) == catalog


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("adapters: {name: a}", "must be a list"),
        ("adapters:\n- name: a\n", "needs string `name` and `path`"),
        ("adapters:\n- {name: a, path: /x}\n- {name: a, path: /y}\n", "listed twice"),
        ("preloadStrategy: eager\n", "preloadStrategy"),
        ("- a\n", "expected a mapping"),
        ("adapters: [", "invalid YAML"),
    ],
    ids=["not-a-list", "no-path", "duplicate", "bad-strategy", "not-a-mapping", "bad-yaml"],
)
def test_bad_catalogues_are_rejected(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_catalog(text)


def _write(path: pathlib.Path, text: str, mtime_ns: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_file_catalogue_follows_edits_and_keeps_the_last_good_one(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "adapters.yaml"
    _write(path, "adapters:\n- {name: a, path: /a}\n", 1_000_000_000)
    catalog = FileCatalog(path)
    assert catalog.current().path_of("a") == "/a"
    _write(path, "adapters:\n- {name: b, path: /b}\n", 2_000_000_000)
    assert catalog.current().paths == {"b": "/b"}
    _write(path, "adapters: [", 3_000_000_000)
    assert catalog.current().paths == {"b": "/b"}
    path.unlink()
    assert catalog.current().paths == {"b": "/b"}


def test_a_missing_or_bad_file_fails_at_start(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        FileCatalog(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("adapters: 3")
    with pytest.raises(ConfigError, match="must be a list"):
        FileCatalog(bad)
