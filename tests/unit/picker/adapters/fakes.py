"""A stand-in for `AdapterStatePush` (the pods' sidecars), for loader, preload and unload tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from epp.clock import FakeClock
from epp.picker.adapters.catalog import Catalog
from epp.picker.adapters.loader import Key, SidecarCallError
from epp.picker.datastore.types import AdapterState


@dataclass
class FakePods:
    """Pods' registered adapters behind a sidecar: loads and unloads change them and are recorded.

    `reachable=False` answers None (no stream up: the loader falls back to HTTP); `refuse`
    makes the sidecar refuse a pair; `gate`, when set, holds every call until it is set.
    """

    clock: FakeClock
    registered: dict[str, set[str]] = field(default_factory=dict)
    reachable: bool = True
    refuse: dict[Key, SidecarCallError] = field(default_factory=dict)
    gate: asyncio.Event | None = None
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (verb, address, adapter)
    running_now: int = 0
    most_at_once: int = 0

    def state(self, address: str) -> AdapterState | None:
        if not self.reachable or address not in self.registered:
            return None
        return AdapterState(received_at=self.clock.now(), registered=frozenset(self.registered[address]))

    async def load(self, address: str, adapter: str, path: str) -> bool | None:
        return await self._call("load", address, adapter)

    async def unload(self, address: str, adapter: str) -> bool | None:
        return await self._call("unload", address, adapter)

    async def _call(self, verb: str, address: str, adapter: str) -> bool | None:
        if not self.reachable:
            return None
        self.calls.append((verb, address, adapter))
        self.running_now += 1
        self.most_at_once = max(self.most_at_once, self.running_now)
        try:
            if self.gate is not None:
                await self.gate.wait()
            else:
                await asyncio.sleep(0)
            refused = self.refuse.get((address, adapter))
            if refused is not None:
                raise refused
            held = self.registered.setdefault(address, set())
            if verb == "load":
                changed = adapter not in held
                held.add(adapter)
            else:
                changed = adapter in held
                held.discard(adapter)
            return changed
        finally:
            self.running_now -= 1

    def verbs(self) -> list[tuple[str, str]]:
        return [(verb, adapter) for verb, _, adapter in self.calls]


@dataclass
class CatalogFile:
    """A catalogue that tests edit, as a user edits the mounted file."""

    current: Catalog

    def __call__(self) -> Catalog:
        return self.current
