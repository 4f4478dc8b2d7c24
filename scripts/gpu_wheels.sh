#!/usr/bin/env bash
# Build the wheel folder .whl/ (repo root, git-ignored) that scripts/gpu_check.sh installs on a GPU
# machine that reaches no package registry.  Its image has torch, torchaudio, transformers, h5py,
# pyarrow, typer, rich, tqdm, numpy and pytest, but not soundfile (libsndfile is bundled in
# soundfile's manylinux wheel, which needs cffi, which needs pycparser) nor PyAV (FFmpeg in its wheel:
# MP3 and m4a are decoded by it, and run.json records its version).
#
#   scripts/gpu_wheels.sh [PYTHON_VERSION]     # default 3.12, the device image's python3
#
# Then, with the device tool: run(command="bash scripts/gpu_check.sh", carry=[".whl"]).
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
PY=${PYTHON:-python3}
rm -rf .whl && mkdir -p .whl
# pinned to the versions tested with scripts/gpu_check.sh --device cpu (constraints.txt for soundfile)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl \
    "soundfile==$(sed -n 's/^soundfile==//p' constraints.txt)" "cffi>=1.17" "pycparser" \
    "av==$(sed -n 's/^av==//p' constraints.txt)"
ls -l .whl
du -sh .whl
