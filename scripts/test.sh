#!/usr/bin/env bash
# Create/refresh .venv with the pinned, tested dependency set (Ray and lhotse extras included: their
# tests run for real on a local cluster / real CutSets) and run the test suite (CPU only, no network).
# --tests-only: pytest alone, in the environment already installed (.ci/run's second tier).
set -euo pipefail
cd "$(dirname "$0")/.."
# the tests run in one process more than there are cores, at most 4 (pytest-xdist; the tests that use Ray
# in one of them: tests/conftest.py): much of the suite's time is spent waiting on its real subprocesses
# (kill trials, CLI runs, Ray), which another process's tests use: on 2 cores, 3 processes kept the cores
# busier than 2 (docs/performance.md, "The test suite's time"). MIMI_TEST_PROCS=1: one process.
procs=${MIMI_TEST_PROCS:-$(( $(nproc) + 1 ))}
(( procs > 4 )) && procs=4
xdist=()
(( procs > 1 )) && xdist=(-n "$procs" --dist loadgroup)
if [ "${1:-}" = "--tests-only" ]; then
  shift
  exec .venv/bin/python -m pytest "${xdist[@]}" "$@"
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,ray,lhotse,parquet,s3,moshi-ref,lint,report,megatron]'
# moshi (test reference for --framing moshi-stream) pins an older numpy: installed without its dependencies
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -c constraints.txt moshi
.venv/bin/python -W ignore -c "import torch, torchaudio, ray, lhotse, pyarrow, datasets, av, moshi, megatron.core; print('torch', torch.__version__, '| torchaudio', torchaudio.__version__, '| ray', ray.__version__, '| lhotse', lhotse.__version__, '| pyarrow', pyarrow.__version__, '| datasets', datasets.__version__, '| av', av.__version__, '| moshi', moshi.__version__, '| megatron-core', megatron.core.__version__)"
# static checks first (seconds): pyflakes + bugbear, the declared dependencies against the imports, and
# the architecture's import contracts (pyproject.toml's [tool.importlinter]: layers, torch-free parts)
.venv/bin/ruff check -q mimi_extract tests scripts
.venv/bin/deptry . > .venv/deptry.log 2>&1 || { cat .venv/deptry.log; exit 1; }
.venv/bin/lint-imports --no-cache > .venv/lint-imports.log 2>&1 || { cat .venv/lint-imports.log; exit 1; }
exec .venv/bin/python -m pytest "${xdist[@]}" "$@"
