#!/usr/bin/env bash
# One-shot GPU check, written for a lent GPU machine that reaches no package registry (at most ~9 minutes:
# the phase limits add up to 560 s, so run it with timeout_s 590; --compile adds the compile phase, 45 s
# more, past one call's 600 s: run it alone, or in a second call).
#
#   scripts/gpu_wheels.sh                 # here, once: .whl/ with soundfile, cffi, pycparser, av (cp312)
#   device run: bash scripts/gpu_check.sh      carry: [".whl"]      timeout_s: 590
#   scripts/gpu_check.sh --device cpu     # the dry run: tiny model, small corpus, same phases, no time limits
#
# Installs the carried wheels (--no-index --no-deps) into $SITE and runs the project from this
# checkout (PYTHONPATH), then, each phase under its own `timeout`, each writing its results to $OUT
# before the next starts (a phase that fails or times out loses only itself):
#   env        versions, nvidia-smi, the imports the tool needs
#   tests      tests/engines/test_device.py and tests/audio/test_device_resample.py -k DEVICE: padded, chunked
#              (full-size on CUDA) and end-to-end `verify` against the single-item reference, strict fp32
#              (TF32 off); resampling on the device against the host's, and `verify --resample-on device`
#   bench      scripts/bench.py: per-item MimiModel loop vs `mimi-extract codes` end to end and
#              encoding phase (x real time), encoder idle share, GPU utilisation per phase; the default
#              run has the default feeding processes per GPU, a second run --feeders-per-gpu 1
#   resample   scripts/bench_resample.py: resampling on the device, exact against the host path at full
#              size (input max |diff|, latent max relative diff, codes agreement classified by verify's
#              tie rule) and its speed on the GPU's step shapes (x real time, H2D bytes)
#   precision  scripts/bench_precision.py: fp32 / TF32 / bf16 throughput on fixed step shapes,
#              per-codebook agreement with strict fp32, mismatches classified by verify's tie rule
#   scale      scripts/bench.py on many short utterances (where the run's own process costs most per
#              audio second), the rows that decide scale: feeding processes per GPU 1 vs 4, 4 with one
#              writer (--single-writer: the runner writes every shard, as before 0.4.0) vs 4 writing
#              their own, and resampling on the host vs on the device
#   compile    only with --compile: the same for torch.compile of the strict encoder, kept only if faster and exact
#   fidelity   only with FIDELITY=1 (~100 s more): scripts/bench_fidelity.py (codes with and without
#              --fidelity) and scripts/bench_decode.py (decode --all's batches vs per-item decode), in log.txt
#   summary    summary.md and results.json from the above; the table is printed last
# Files in $OUT (8 at most come back): log.txt phases.txt bench.json resample.json precision.json
# compile.json summary.md results.json (scale's rows are in results.json and summary.md: its own
# json is written outside $OUT).
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
DEVICE=cuda
COMPILE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --compile) COMPILE=1; shift ;;
    --no-compile) COMPILE=0; shift ;;
    *) echo "usage: $0 [--device cuda|cpu] [--compile]" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d /tmp/gpu-check-XXXX)}
mkdir -p "$OUT"
SITE=${SITE:-/tmp/mimi-site}
LOG=$OUT/log.txt
: >"$OUT/phases.txt"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
# scale's rows: the default run, then these (each a `mimi-extract codes` of its own)
SCALE_VARIANTS=("--feeders-per-gpu 1" "--feeders-per-gpu 4 --single-writer" "--feeders-per-gpu 4"
                "--feeders-per-gpu 4 --resample-on host")
if [ "$DEVICE" = cpu ]; then  # dry run: the same phases on the tiny model, sized for two CPU cores
  # (the smallest sizes that run every path: a 256 sgemm, resampling's files a quarter as long, its speed
  # and precision's on small steps, one rep)
  MODEL=random-tiny; BENCH_ARGS="--files 12 --min-seconds 0.5 --max-seconds 4 --sgemm-size 256"; SHAPES="2x1"
  CSHAPES="2x1"; REPS=1; RESAMPLE_ARGS="--model random-tiny --q 8 --reps 1 --exact-scale 0.25 --speed-shapes 4x1,2x2"
  # no phase limits: they protect the GPU's 15-minute budget, and on a CPU they would only measure the
  # machine's load (a busy CI machine ran bench and precision past 240 s / 120 s, every number right)
  T_INSTALL=0; T_ENV=0; T_TESTS=0; T_BENCH=0; T_RESAMPLE=0; T_PREC=0; T_COMPILE=0; T_SUMMARY=0
  TESTS_K="cpu and padded_batch"  # the phase's command, run once: the suite runs every one of these on the CPU itself
  SCALE_ARGS="--files 4 --min-seconds 0.5 --max-seconds 1 --sgemm-size 256 --no-loop-script"; T_SCALE=0
  # (--feeders-per-gpu 1 and the loop script: bench has just run them; on a CPU the feeders per GPU
  # change nothing, so --feeders-per-gpu 4 alone is the default row's run: its option is in the other two)
  SCALE_VARIANTS=("${SCALE_VARIANTS[1]}" "${SCALE_VARIANTS[3]}")
else
  MODEL=random-default; BENCH_ARGS="--files 384 --min-seconds 1 --max-seconds 20"; SHAPES="64x4.6,128x10"
  CSHAPES="64x4.6"; REPS=10; RESAMPLE_ARGS="--model random-default --q 32 --rows 16 --step-seconds 120 --chunk-seconds 30"
  # with install 40, env 30 and summary 20: 560 s in all (the scale phase took bench's share above 600)
  T_INSTALL=40; T_ENV=30; T_TESTS=90; T_BENCH=150; T_RESAMPLE=50; T_PREC=60; T_COMPILE=45; T_SUMMARY=20
  TESTS_K=$DEVICE
  SCALE_ARGS="--files 1200 --min-seconds 1 --max-seconds 6"; T_SCALE=120
fi

phase() {  # phase NAME SECONDS COMMAND...: run under timeout (0: none), log everything, record rc and time
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  echo "=== $name (limit $( [ "$limit" = 0 ] && echo none || echo "${limit}s" )): $*" >>"$LOG"
  timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
  rc=$?
  echo "$name rc=$rc $(( $(date +%s) - start ))s$( [ $rc = 124 ] && echo ' TIMEOUT')" | tee -a "$OUT/phases.txt"
}

# -- install: carried wheels only, nothing from a registry ------------------------------------------
if ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c "import soundfile, av" 2>/dev/null; then
  phase install "$T_INSTALL" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
fi
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"

phase env "$T_ENV" bash -c "nvidia-smi 2>/dev/null | head -15; uname -a; nproc; \"$PY\" -c '
import sys, torch, transformers, torchaudio, h5py, numpy, soundfile, av, typer, rich, tqdm
import mimi_extract.cli, mimi_extract.engines
print(\"python\", sys.version.split()[0], \"| torch\", torch.__version__, \"| cuda\", torch.version.cuda,
      \"| transformers\", transformers.__version__, \"| torchaudio\", torchaudio.__version__,
      \"| soundfile\", soundfile.__version__, soundfile.__libsndfile_version__, \"| av\", av.__version__, \"| numpy\", numpy.__version__)
print(\"device:\", torch.cuda.get_device_name() if torch.cuda.is_available() else \"no CUDA\")
'"
phase tests "$T_TESTS" "$PY" -m pytest tests/engines/test_device.py tests/audio/test_device_resample.py -q \
  -k "$TESTS_K" -p no:cacheprovider
phase bench "$T_BENCH" "$PY" scripts/bench.py --device "$DEVICE" --model "$MODEL" $BENCH_ARGS --tool-args "--feeders-per-gpu 1" \
  --json "$OUT/bench.json"
phase resample "$T_RESAMPLE" "$PY" scripts/bench_resample.py --device "$DEVICE" $RESAMPLE_ARGS \
  --workdir "${TMPDIR:-/tmp}/gpu-check-resample" --json "$OUT/resample.json"
phase precision "$T_PREC" "$PY" scripts/bench_precision.py --device "$DEVICE" --model "$MODEL" --shapes "$SHAPES" \
  --reps "$REPS" --json "$OUT/precision.json"
SCALE_JSON=${TMPDIR:-/tmp}/gpu-check-scale.json
rm -f "$SCALE_JSON"
TOOL_ARGS=()
for v in "${SCALE_VARIANTS[@]}"; do TOOL_ARGS+=(--tool-args "$v"); done
phase scale "$T_SCALE" "$PY" scripts/bench.py --device "$DEVICE" --model "$MODEL" $SCALE_ARGS "${TOOL_ARGS[@]}" \
  --json "$SCALE_JSON"
if [ "$COMPILE" = 1 ]; then
  phase compile "$T_COMPILE" "$PY" scripts/bench_precision.py --device "$DEVICE" --model "$MODEL" --shapes "$CSHAPES" \
    --reps "$REPS" --modes fp32 --compile --json "$OUT/compile.json"
fi
if [ "${FIDELITY:-0}" = 1 ]; then  # (docs/fidelity.md; not in the default ~9 minutes)
  ARCH=$([ "$MODEL" = random-tiny ] && echo tiny || echo full)
  phase fidelity 60 "$PY" scripts/bench_fidelity.py --device "$DEVICE" --model "$ARCH" --files 64 --rounds 1
  phase decode 40 "$PY" scripts/bench_decode.py --device "$DEVICE" --model "$ARCH" --items 64 --max-seconds 20 --rounds 2
fi
phase summary "$T_SUMMARY" "$PY" scripts/gpu_summary.py "$OUT" "$SCALE_JSON"
cat "$OUT/summary.md" 2>/dev/null || cat "$OUT/phases.txt"
grep -q "^tests rc=0 " "$OUT/phases.txt" && grep -q "^bench rc=0 " "$OUT/phases.txt" \
  && grep -q "^resample rc=0 " "$OUT/phases.txt" && grep -q "^precision rc=0 " "$OUT/phases.txt"
