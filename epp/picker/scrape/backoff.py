"""How long a scrape loop waits after failures: exponential, capped, jittered.

Jitter keeps endpoints that failed together (a node reboot, a network blip) from retrying in
lockstep; the cap bounds how late we notice a recovered endpoint.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay after the n-th consecutive failure: `base_s × 2^(n-1)`, at most `cap_s`, then jittered.

    The jittered delay lies in [½·d, d] ("equal jitter"), and never below `floor_s` (the scrape
    interval: failing never makes an endpoint scraped more often than a healthy one).
    """

    base_s: float
    cap_s: float
    floor_s: float = 0.0

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.cap_s <= 0 or self.floor_s < 0:
            raise ValueError("backoff delays must be positive")

    def delay_s(self, consecutive_failures: int, rng: random.Random) -> float:
        if consecutive_failures < 1:
            raise ValueError("a backoff delay is for one or more failures")
        # 2**64 already exceeds any cap; limiting the exponent keeps the float finite.
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(consecutive_failures - 1, 64))
        return max(self.floor_s, rng.uniform(ceiling / 2.0, ceiling))
