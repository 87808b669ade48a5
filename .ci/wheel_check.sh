#!/usr/bin/env bash
# lora-epp as a user installs it from a wheel: a fresh venv, the wheel and its dependencies only
# (no editable checkout, no fix-up), `pip check`, then one span through the OTLP exporter to a
# local collector stub and the Envoy stubs imported (`.ci/otlp_span.py`).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/pip wheel --quiet --no-deps --wheel-dir "$work/dist" .
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet "$work"/dist/lora_epp-*.whl
"$work/venv/bin/pip" check
(cd "$work" && "$work/venv/bin/python" "$OLDPWD/.ci/otlp_span.py")
