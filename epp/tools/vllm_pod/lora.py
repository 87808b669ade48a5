"""LoRA adapter residency: GPU slots over a host-memory tier, each least-recently-used first.

Invariants: at most `max_gpu_slots` adapters on the GPU and at most `max_cpu_adapters` in host
memory. An adapter used by a request in the running batch is *pinned*: its slot is never taken,
which is what makes a request for another adapter wait (vLLM's "deferred" reason).

The host tier is kept as vLLM keeps it, for `epp sim` and `epp bench` alike, so the bench's figures
follow vLLM: it is inclusive (every GPU adapter also has a host copy), every use refreshes both
LRUs, and a full host tier drops the oldest copy that is not on the GPU first. An adapter evicted
from its slot therefore keeps its host copy until `max_cpu_adapters` newer ones push it out, and
its next load is a host copy, not a read from storage.

The runtime API and startup modules follow vLLM 0.32.0 as a real server shows it (DEBUG log of
`vllm/lora/model_manager.py`, checked by `tests/realvllm/test_lora_lifecycle.py`): registering an
adapter (`--lora-modules`, `POST /v1/load_lora_adapter`) reads it from storage into host memory
*and* puts it in a GPU slot (`register`); unloading it only drops the name (`forget`): its copies
stay in both tiers until newer adapters push them out, and a later load under the same name is a
new adapter, read from storage again.
"""

from __future__ import annotations

import enum
import itertools
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


class LoraSlots:
    """GPU slots over a host tier, each evicting the least recently used unpinned adapter first."""

    def __init__(self, max_gpu_slots: int, max_cpu_adapters: int) -> None:
        if max_gpu_slots < 1:
            raise ValueError(f"max_loras must be ≥ 1, got {max_gpu_slots}")
        if max_cpu_adapters < max_gpu_slots:
            raise ValueError(f"max_cpu_loras ({max_cpu_adapters}) must be ≥ max_loras ({max_gpu_slots})")
        self.max_gpu_slots = max_gpu_slots
        self.max_cpu_adapters = max_cpu_adapters
        # Oldest first; moving to the end marks use.
        self._gpu: OrderedDict[str, None] = OrderedDict()
        self._cpu: OrderedDict[str, None] = OrderedDict()
        self._forgotten = itertools.count()

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
        self.load_to_cpu(adapter, pinned)
        return Activation(adapter, source, evicted)

    def load_to_cpu(self, adapter: str, pinned: Collection[str]) -> bool:
        """Read an adapter into host memory (startup modules, the runtime load API, a slot load).

        False when there is no room: every host copy belongs to a pinned GPU adapter.
        """
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

    def register(self, adapter: str, pinned: Collection[str]) -> bool:
        """vLLM's `add_lora` (startup modules, the runtime load API): a read from storage into host
        memory that also takes a GPU slot, over the least recently used unpinned one.

        vLLM evicts the oldest slot even if the batch uses it and loads that one back next step;
        here a pinned slot is kept and, with every slot pinned, the adapter waits in host memory.
        False when host memory has no room for it either.
        """
        if not self.load_to_cpu(adapter, pinned):
            return False
        if self.can_activate(adapter, pinned):
            self.activate(adapter, pinned)
        return True

    def forget(self, adapter: str) -> None:
        """vLLM's unload: the name goes, its weights stay where they are until LRU evicts them.

        The copies are renamed, in place in both LRU orders, to a name no request can ask for, so
        they keep their slot and host room and a later `register` of the same name reads storage.
        """
        if adapter not in self._cpu:
            return
        ghost = f"\0unloaded-{next(self._forgotten)}:{adapter}"
        self._cpu = OrderedDict((ghost if name == adapter else name, None) for name in self._cpu)
        self._gpu = OrderedDict((ghost if name == adapter else name, None) for name in self._gpu)
