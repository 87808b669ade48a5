"""`epp demo` end to end, small: exits 0, prints the table, writes JSON, EPP beats round robin."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_demo_runs_and_shows_fewer_adapter_loads_than_round_robin(tmp_path: pathlib.Path) -> None:
    command = [sys.executable, "-m", "epp", "demo", "--pods", "2", "--adapters", "4", "--requests", "40",
               "--concurrency", "4", "--out", str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=110, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "round-robin" in result.stdout
    assert "adapter loads" in result.stdout
    runs = {run["name"]: run for run in json.loads((tmp_path / "results.json").read_text())}
    assert set(runs) == {"epp", "round-robin"}
    assert runs["epp"]["errors"] == 0
    assert runs["round-robin"]["errors"] == 0
    assert runs["epp"]["requests"] == 40
    assert runs["epp"]["adapter_loads"] < runs["round-robin"]["adapter_loads"]
