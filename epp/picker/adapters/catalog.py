"""The adapter catalogue: adapter name → the `lora_path` a model-server pod loads it from.

The controller writes it (ConfigMap key `adapters.yaml`, mounted into the EPP and passed as
`--adapter-catalog FILE`); the loader reads it. Format:

    preloadStrategy: demand          # or planned, or all
    adapters:
    - name: legal-assistant-v2
      path: huggingface-org/legal-lora   # what POST /v1/load_lora_adapter gets as lora_path

`FileCatalog` re-reads the file when its modification time changes, because a mounted
ConfigMap is updated in place when the user edits the adapter list (no EPP restart).
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from epp.errors import ConfigError

log = logging.getLogger(__name__)


# demand: on the first request naming it; planned: also ahead, on the placement plan's homes;
# all: on every pod.
PRELOAD_STRATEGIES = ("demand", "planned", "all")


@dataclass(frozen=True, slots=True)
class Catalog:
    paths: Mapping[str, str]  # adapter name → lora_path inside the model-server pod
    preload_strategy: str = "demand"

    def path_of(self, adapter: str) -> str | None:
        return self.paths.get(adapter)

    def to_yaml(self) -> str:
        doc = {
            "preloadStrategy": self.preload_strategy,
            "adapters": [{"name": name, "path": path} for name, path in self.paths.items()],
        }
        return yaml.safe_dump(doc, sort_keys=False)


def parse_catalog(text: str) -> Catalog:
    try:
        doc: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"adapter catalogue: invalid YAML: {error}") from error
    if doc is None:
        return Catalog({})
    if not isinstance(doc, Mapping):
        raise ConfigError("adapter catalogue: expected a mapping with `adapters`")
    entries = doc.get("adapters") or []
    if not isinstance(entries, list):
        raise ConfigError("adapter catalogue: `adapters` must be a list")
    paths: dict[str, str] = {}
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        path = entry.get("path") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ConfigError(f"adapter catalogue: adapters[{index}] needs string `name` and `path`")
        if name in paths:
            raise ConfigError(f"adapter catalogue: adapter {name!r} is listed twice")
        paths[name] = path
    strategy = doc.get("preloadStrategy", "demand")
    if strategy not in PRELOAD_STRATEGIES:
        allowed = ", ".join(PRELOAD_STRATEGIES)
        raise ConfigError(f"adapter catalogue: preloadStrategy must be one of {allowed}, got {strategy!r}")
    return Catalog(paths, str(strategy))


class FileCatalog:
    """A catalogue file, re-read when it changes; a bad edit keeps the last good catalogue."""

    def __init__(self, path: pathlib.Path) -> None:
        self._path = path
        self._mtime_ns: int | None = None
        self._catalog = Catalog({})
        self.current()  # fail fast at start-up on a missing or invalid file
        if self._mtime_ns is None:
            raise ConfigError(f"adapter catalogue {path}: cannot read the file")

    def current(self) -> Catalog:
        try:
            mtime_ns = os.stat(self._path).st_mtime_ns
        except OSError:
            log.warning("adapter catalogue unreadable; keeping the last one", extra={"path": str(self._path)})
            return self._catalog
        if mtime_ns == self._mtime_ns:
            return self._catalog
        try:
            catalog = parse_catalog(self._path.read_text(encoding="utf-8"))
        except (OSError, ConfigError) as error:
            if self._mtime_ns is None:
                raise ConfigError(f"adapter catalogue {self._path}: {error}") from error
            log.warning(
                "adapter catalogue invalid; keeping the last one",
                extra={"path": str(self._path), "error": str(error)},
            )
            return self._catalog
        self._catalog, self._mtime_ns = catalog, mtime_ns
        return catalog
