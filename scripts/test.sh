#!/usr/bin/env bash
# Create/refresh .venv with the pinned, tested dependency set (Ray and lhotse extras included: their
# tests run for real on a local cluster / real CutSets) and run the test suite (CPU only, no network).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,ray,lhotse]'
.venv/bin/python -c "import torch, torchaudio, ray, lhotse; print('torch', torch.__version__, '| torchaudio', torchaudio.__version__, '| ray', ray.__version__, '| lhotse', lhotse.__version__)"
exec .venv/bin/python -m pytest "$@"
