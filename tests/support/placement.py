"""The placement plan's full rendezvous order, for tests that pick pods by where they rank."""

from __future__ import annotations

from epp.picker.scheduling.plan import HomePlan


def ranking(adapter: str, pods: tuple[str, ...]) -> tuple[str, ...]:
    """`pods` in `adapter`'s rendezvous order, its first home first: every pod made a home by a
    fresh plan (so no earlier count holds it back), read back in rank order."""
    plan = HomePlan()
    plan.plan_homes(adapter, pods, len(pods))
    return plan.planned_homes(adapter)
