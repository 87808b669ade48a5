"""The layering rules in pyproject.toml's import-linter contracts hold for the code as it is."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    lint_imports = shutil.which("lint-imports", path=str(pathlib.Path(sys.executable).parent))
    assert lint_imports is not None, "import-linter is part of the test extra"
    result = subprocess.run(
        [lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
