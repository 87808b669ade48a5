"""`epp bench --live`: real Envoy, `epp serve` and `epp sim` pods agree with the simulator."""

from __future__ import annotations

import io
import re

import pytest

from epp.tools.bench import live, scenario

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_live_and_simulated_adapter_loads_agree() -> None:
    out = io.StringIO()
    code = live.run_live(scenario.load("brief"), ["default", "round-robin"], out=out)
    assert code == 0, out.getvalue()
    rows = {
        (m["policy"], m["run"]): (int(m["errors"]), float(m["loads"]))
        for m in re.finditer(
            r"^(?P<policy>\S+)\s+(?P<run>live|sim)\s+\d+\s+(?P<errors>\d+)\s+(?P<loads>[\d.]+)",
            out.getvalue(),
            re.M,
        )
    }
    assert set(rows) == {(p, r) for p in ("default", "round-robin") for r in ("live", "sim")}
    assert all(errors == 0 for errors, _ in rows.values())
    # Both worlds agree that round-robin loads adapters far more often than the default policy ...
    for run in ("live", "sim"):
        assert rows[("round-robin", run)][1] > 3 * rows[("default", run)][1]
    # ... and on roughly how often (within a factor of 2).
    live_rr, sim_rr = rows[("round-robin", "live")][1], rows[("round-robin", "sim")][1]
    assert 0.5 < live_rr / sim_rr < 2.0
