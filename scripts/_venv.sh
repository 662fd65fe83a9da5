# Sourced by scripts/up and scripts/test: make .venv exist and hold this project, installed editable.
# Reinstalls only when pyproject.toml changed since the last install (a stamp holds its hash).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.fleetpulse-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)-${FLEETPULSE_EXTRAS:-test,dev,bench}"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "==> installing fleetpulse[${FLEETPULSE_EXTRAS:-test,dev,bench}] into .venv (first run takes a minute)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' >&2 || true
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[${FLEETPULSE_EXTRAS:-test,dev,bench}]" 2>&1 \
    | grep -v '^WARNING: Location' >&2 || true
  "$VENV/bin/python" -c "import nats, pyarrow, msgpack, numpy, shared, services" \
    || { echo "install failed: see the pip output above" >&2; exit 1; }
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
