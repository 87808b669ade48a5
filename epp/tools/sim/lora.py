"""LoRA adapter residency: GPU slots and a CPU tier, both LRU, as vLLM's LRU adapter managers behave.

Pure bookkeeping (no time, no I/O) so the live simulator and a discrete-event model can share it.
Invariants: at most `max_gpu_slots` adapters on the GPU, at most `max_cpu_adapters` in host memory,
and every GPU adapter is also in host memory. An adapter used by a running request is *pinned*:
it is never evicted, which is what makes a request wait for a slot (vLLM's "deferred" reason).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass


class AdapterTier(enum.Enum):
    """Where an adapter's weights are: what activating it costs."""

    GPU = "gpu"  # in a slot: free
    CPU = "cpu"  # host memory: a copy into a slot
    DISK = "disk"  # nowhere: read from storage, then copy


@dataclass(frozen=True, slots=True)
class Activation:
    """The result of putting an adapter into a GPU slot."""

    adapter: str
    source: AdapterTier
    evicted_from_gpu: str | None


class LoraCache:
    """GPU slots over a CPU tier, each evicting least-recently-used unpinned adapters first."""

    def __init__(self, max_gpu_slots: int, max_cpu_adapters: int) -> None:
        if max_gpu_slots < 1:
            raise ValueError(f"max_gpu_slots must be ≥ 1, got {max_gpu_slots}")
        if max_cpu_adapters < max_gpu_slots:
            raise ValueError(
                f"max_cpu_adapters ({max_cpu_adapters}) must be ≥ max_gpu_slots ({max_gpu_slots})"
            )
        self.max_gpu_slots = max_gpu_slots
        self.max_cpu_adapters = max_cpu_adapters
        # Oldest first; moving to the end marks use.
        self._gpu: OrderedDict[str, None] = OrderedDict()
        self._cpu: OrderedDict[str, None] = OrderedDict()

    @property
    def gpu_adapters(self) -> tuple[str, ...]:
        """Adapters in GPU slots, least recently used first."""
        return tuple(self._gpu)

    @property
    def cpu_adapters(self) -> tuple[str, ...]:
        """Adapters in host memory (including those also on the GPU), least recently used first."""
        return tuple(self._cpu)

    def tier(self, adapter: str) -> AdapterTier:
        if adapter in self._gpu:
            return AdapterTier.GPU
        if adapter in self._cpu:
            return AdapterTier.CPU
        return AdapterTier.DISK

    def can_activate(self, adapter: str, pinned: Collection[str]) -> bool:
        """True when `adapter` is on the GPU already or a slot is free or holds an unpinned adapter."""
        if adapter in self._gpu or len(self._gpu) < self.max_gpu_slots:
            return True
        return any(name not in pinned for name in self._gpu)

    def activate(self, adapter: str, pinned: Collection[str]) -> Activation:
        """Put `adapter` into a GPU slot (a use, for LRU), evicting the LRU unpinned slot if full.

        Raises ValueError when every slot is pinned; call `can_activate` first.
        """
        if adapter in self._gpu:
            self._gpu.move_to_end(adapter)
            self._cpu.move_to_end(adapter)
            return Activation(adapter, AdapterTier.GPU, None)
        source = AdapterTier.CPU if adapter in self._cpu else AdapterTier.DISK
        evicted: str | None = None
        if len(self._gpu) >= self.max_gpu_slots:
            evicted = self._lru_unpinned(self._gpu, pinned)
            if evicted is None:
                raise ValueError(f"no GPU slot for adapter {adapter!r}: all {self.max_gpu_slots} pinned")
            del self._gpu[evicted]
        self._gpu[adapter] = None
        self._admit_to_cpu(adapter, pinned)
        return Activation(adapter, source, evicted)

    def load_to_cpu(self, adapter: str, pinned: Collection[str]) -> bool:
        """Read an adapter into host memory (runtime load, startup modules); False if no room at all."""
        if adapter in self._cpu:
            self._cpu.move_to_end(adapter)
            return True
        return self._admit_to_cpu(adapter, pinned)

    def _admit_to_cpu(self, adapter: str, pinned: Collection[str]) -> bool:
        if adapter in self._cpu:
            self._cpu.move_to_end(adapter)
            return True
        if len(self._cpu) >= self.max_cpu_adapters:
            # Prefer dropping a host copy that is not on the GPU; else an unpinned GPU adapter too.
            victim = next((name for name in self._cpu if name not in self._gpu and name != adapter), None)
            if victim is None:
                victim = self._lru_unpinned(self._gpu, [*pinned, adapter])
                if victim is None:
                    return False
                del self._gpu[victim]
            del self._cpu[victim]
        self._cpu[adapter] = None
        return True

    @staticmethod
    def _lru_unpinned(entries: OrderedDict[str, None], pinned: Collection[str]) -> str | None:
        return next((name for name in entries if name not in pinned), None)
