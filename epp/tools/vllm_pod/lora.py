"""LoRA adapter residency: GPU slots over a host-memory tier, each least-recently-used first.

Invariants: at most `max_gpu_slots` adapters on the GPU and at most `max_cpu_adapters` in host
memory. An adapter used by a request in the running batch is *pinned*: its slot is never taken,
which is what makes a request for another adapter wait (vLLM's "deferred" reason).

How the host tier is kept is a `HostTier` choice, because the two consumers were calibrated
differently and `epp bench`'s published figures must stay reproducible:

- `INCLUSIVE` (vLLM's; `epp sim`): every GPU adapter also has a host copy, every use refreshes
  both LRUs, and a full host tier drops the oldest copy that is not on the GPU first.
- `LOAD_HISTORY` (`epp bench`): the host tier remembers the last `max_cpu_adapters` adapters loaded
  into a slot, refreshed only by loads; a GPU resident may have lost its host copy, so its next
  load after eviction reads storage again.
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


class HostTier(enum.Enum):
    """How the host-memory tier is kept (see the module docstring)."""

    INCLUSIVE = "inclusive"
    LOAD_HISTORY = "load-history"


@dataclass(frozen=True, slots=True)
class Activation:
    """The result of putting an adapter into a GPU slot."""

    adapter: str
    source: AdapterTier
    evicted_from_gpu: str | None


class LoraSlots:
    """GPU slots over a host tier, each evicting the least recently used unpinned adapter first."""

    def __init__(
        self, max_gpu_slots: int, max_cpu_adapters: int, host_tier: HostTier = HostTier.INCLUSIVE
    ) -> None:
        if max_gpu_slots < 1:
            raise ValueError(f"max_loras must be ≥ 1, got {max_gpu_slots}")
        if max_cpu_adapters < max_gpu_slots:
            raise ValueError(f"max_cpu_loras ({max_cpu_adapters}) must be ≥ max_loras ({max_gpu_slots})")
        self.max_gpu_slots = max_gpu_slots
        self.max_cpu_adapters = max_cpu_adapters
        self.host_tier = host_tier
        # Oldest first; moving to the end marks use.
        self._gpu: OrderedDict[str, None] = OrderedDict()
        self._cpu: OrderedDict[str, None] = OrderedDict()

    @property
    def gpu_adapters(self) -> tuple[str, ...]:
        """Adapters in GPU slots, least recently used first."""
        return tuple(self._gpu)

    @property
    def cpu_adapters(self) -> tuple[str, ...]:
        """Adapters with a host copy, least recently used first."""
        return tuple(self._cpu)

    def on_gpu(self, adapter: str) -> bool:
        return adapter in self._gpu

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

        Raises ValueError when every slot is pinned; check `can_activate` (or the batch's adapter
        count) first.
        """
        gpu = self._gpu
        if adapter in gpu:
            gpu.move_to_end(adapter)
            if self.host_tier is HostTier.INCLUSIVE:
                self._cpu.move_to_end(adapter)
            return Activation(adapter, AdapterTier.GPU, None)
        source = AdapterTier.CPU if adapter in self._cpu else AdapterTier.DISK
        evicted: str | None = None
        if len(gpu) >= self.max_gpu_slots:
            evicted = next((name for name in gpu if name not in pinned), None)
            if evicted is None:
                raise ValueError(f"no GPU slot for adapter {adapter!r}: all {self.max_gpu_slots} pinned")
            del gpu[evicted]
        gpu[adapter] = None
        if self.host_tier is HostTier.INCLUSIVE:
            self._admit_to_cpu(adapter, pinned)
        elif source is AdapterTier.CPU:
            self._cpu.move_to_end(adapter)
        else:
            self._cpu[adapter] = None
            if len(self._cpu) > self.max_cpu_adapters:
                self._cpu.popitem(last=False)
        return Activation(adapter, source, evicted)

    def load_to_cpu(self, adapter: str, pinned: Collection[str]) -> bool:
        """Read an adapter into host memory (startup modules, the runtime load API); False if no room."""
        if adapter in self._cpu:
            self._cpu.move_to_end(adapter)
            return True
        if self.host_tier is HostTier.LOAD_HISTORY:
            self._cpu[adapter] = None
            if len(self._cpu) > self.max_cpu_adapters:
                self._cpu.popitem(last=False)
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
                victim = next((name for name in self._gpu if name not in pinned and name != adapter), None)
                if victim is None:
                    return False
                del self._gpu[victim]
            del self._cpu[victim]
        self._cpu[adapter] = None
        return True
