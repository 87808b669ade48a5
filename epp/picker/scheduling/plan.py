"""Where each adapter should live: a deterministic, sticky set of home pods per adapter.

The per-request score reacts to what is resident; it has no view of where an adapter
*should* go when it is resident nowhere or needs another home. Left to load and ties, two
EPP replicas (or one EPP before and after a restart) send the same adapter to different
pods and each load costs a swap. The plan answers that question the same way everywhere:

- An adapter's candidate pods are ranked by rendezvous (highest-random-weight) hashing of
  (adapter, pod name) with a stable hash, so every process ranks them alike, and a pod
  joining or leaving moves only the adapters that ranked it among their homes.
- Its home count is what its traffic share asks for (the caller's `desired`), with
  hysteresis: it grows at once, and shrinks only when the demand falls to `shrink_at` of
  the current count, so a popular adapter's homes do not flap with noise in its share.
- Its homes are the first `count` pods of its ranking over the pool (the scheduler passes
  the pool's endpoint names): a pod that leaves hands its place to the next in rank. Pods
  filtered out of one request keep their place; the per-request score decides among what
  is left, as it does for a home that is too busy.

Long-tail adapters get one home each, spread evenly by the hash; hot ones get many. Pure
and clock-free; bounded to `max_adapters` remembered adapters (least recently planned
forgotten first).
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict

_MASK64 = (1 << 64) - 1


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text` that is the same in every process (unlike `hash`, which is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _mix(x: int) -> int:
    """splitmix64's finaliser: spreads the XOR of two hashes over all 64 bits."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class HomePlan:
    """Planned home pods per adapter: rendezvous order, traffic-sized, with hysteresis."""

    def __init__(self, *, shrink_at: float = 0.5, max_adapters: int = 20_000) -> None:
        if not 0 < shrink_at <= 1:
            raise ValueError("shrink_at must be in (0, 1]")
        if max_adapters <= 0:
            raise ValueError("max_adapters must be positive")
        self._shrink_at = shrink_at
        self._max_adapters = max_adapters
        self._counts: OrderedDict[str, int] = OrderedDict()  # adapter -> planned home count
        # adapter -> (the pods it was planned over, count, homes in rank order, the same as a set);
        # the pool's names come as one tuple until the pool changes, so the check is usually `is`.
        self._homes: dict[str, tuple[tuple[str, ...], int, tuple[str, ...], frozenset[str]]] = {}
        self._pool_hashes: tuple[tuple[str, ...], tuple[int, ...]] = ((), ())

    def __len__(self) -> int:
        return len(self._counts)

    def plan_homes(self, adapter: str, pods: tuple[str, ...], desired: int) -> frozenset[str]:
        """Plan `adapter`'s homes among `pods` for a request, sized from `desired` (at least 1).

        This moves the plan: the home count follows `desired` with hysteresis, and the result is
        what `planned_homes` reads back. The scorer calls it once per request; a set, because
        what it asks is whether a candidate is a home."""
        count = self._count(adapter, max(1, desired))
        cached = self._homes.get(adapter)
        if cached is not None and cached[1] == count and (cached[0] is pods or cached[0] == pods):
            return cached[3]
        ranked = self._first(adapter, pods, count)
        planned = frozenset(ranked)
        self._homes[adapter] = (pods, count, ranked, planned)
        return planned

    def planned_homes(self, adapter: str) -> tuple[str, ...]:
        """The homes `plan_homes` last planned for `adapter`, first home first (() when none).

        Reading it leaves the plan as it is, so the decision record, the candidate window, the
        adapter preloader and unloader and the pool view can ask without sizing anything; in rank
        order, because they take the first homes first. An adapter the plan has forgotten (or
        never planned) has none."""
        cached = self._homes.get(adapter)
        return () if cached is None else cached[2]

    def _first(self, adapter: str, pods: tuple[str, ...], count: int) -> tuple[str, ...]:
        """The first `count` of `adapter`'s ranking: O(pods) hashes, once per adapter and pool."""
        seed = stable_hash(adapter)
        weighted = [(_mix(seed ^ h), pod) for h, pod in zip(self._hashes(pods), pods, strict=True)]
        return tuple(pod for _, pod in heapq.nlargest(count, weighted))

    def _count(self, adapter: str, desired: int) -> int:
        current = self._counts.get(adapter)
        if current is None or desired > current or desired <= current * self._shrink_at:
            current = desired
        self._counts[adapter] = current
        self._counts.move_to_end(adapter)
        if len(self._counts) > self._max_adapters:
            forgotten, _ = self._counts.popitem(last=False)
            self._homes.pop(forgotten, None)
        return current

    def _hashes(self, pods: tuple[str, ...]) -> tuple[int, ...]:
        """Each pod's stable hash, kept for the last pool seen (it changes only when pods do)."""
        if self._pool_hashes[0] is not pods and self._pool_hashes[0] != pods:
            self._pool_hashes = (pods, tuple(stable_hash(pod) for pod in pods))
        return self._pool_hashes[1]
