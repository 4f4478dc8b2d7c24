#!/usr/bin/env bash
# Create/refresh .venv with the pinned, tested dependency set and run the test suite (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test]'
.venv/bin/python -c "import torch, torchaudio; print('torch', torch.__version__, '| torchaudio', torchaudio.__version__)"
exec .venv/bin/python -m pytest "$@"
