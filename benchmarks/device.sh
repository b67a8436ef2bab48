#!/usr/bin/env bash
# One prepared run on the GPU machine (the device tool): install the packages from this checkout,
# run tests/gpu, then the paper-size benchmarks; results under $OUT.
#
# The machine has no network. Its image has JAX 0.11.2 (CUDA 13), nvcc 13.0, nanobind,
# scikit-build-core, pytest, hypothesis and matplotlib, but not hatchling (nor its tomlkit and
# trove-classifiers) or e3nn-jax: fetch their wheels here first, into the ignored .whl/
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl hatchling tomlkit trove-classifiers e3nn-jax==0.21.0
# and call the device tool with carry [".whl"] and the command `bash benchmarks/device.sh`.
# The end-to-end benchmarks (issue 16: e3j-models force time vs atoms, MD ms/step per installed backend
# and the e3nn-jax twin, run-to-run deviation) are a second call, `E3J_DEVICE_E2E=1 bash benchmarks/device.sh`
# (install, info, then only that step, bounded to 420 s): they need e3j-models' dependencies too,
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl flax ase vesin tqdm   (with their dependencies)
# but with --no-deps and the dependencies named, not resolved: resolved, pip picked flax 0.3.3 with
# jax 0.4.29, numpy and scipy (87 MB, over the 64 MiB carry, and shadowing the image's JAX). What ran
# in a rehearsal (42 MB with the first line's wheels): --no-deps ... flax==0.12.12 optax orbax-checkpoint
# absl-py etils humanize msgpack protobuf pyyaml rich markdown-it-py mdurl pygments tensorstore
# treescope aiofiles prometheus-client psutil simplejson uvloop attrs sympy mpmath ase vesin tqdm
# E3J_E2E_ARGS replaces that step's sections and sizes and E3J_E2E_OUT its results file (e.g. the
# force-inference section alone, after a bounded run whose MD took the time: see _device_common.sh).
# E3J_DEVICE_STEPS picks the steps after install and info, in order (default: tests table1 mosaic
# scaling fig1; also e2e, diag: ~60 s of TP-forward timings that tell host from kernel time, and
# grouped: mixed multiplicities, each GPU backend's grouped kernels against its groups' own),
# and E3J_DEVICE_BUDGET (seconds, default 570) bounds the whole run: each step's own limit is cut to
# what is left, so a 15-minute lease can be split into two calls; E3J_TESTS_TIMEOUT (default 270)
# bounds tests/gpu and E3J_TESTS_ARGS adds pytest arguments (e.g. "-k grouped": a kernel change's
# own cases first, in a fraction of the suite's time). Seen on the H200 (2026-12-04, e3j-cuda prebuilt): install + info ~30 s, tests/gpu
# 303 s (88 tests on 12 processes, compile-bound), grouped ~120 s, diag ~60 s; a machine's start ~1 min.
# A prebuilt e3j-cuda wheel in .whl (pip wheel packages/e3j-cuda with E3J_CUDA=ON and
# CMAKE_ARGS=-DE3J_CUDA_ARCHITECTURES=90a-real, on any x86-64 machine with nvcc) skips the build there.
# Rehearse it on a CPU machine with E3J_DEVICE_REHEARSAL=1 (python3 = a Python 3.12 with that image's
# packages): the same steps, with small benchmark sizes.
set -uo pipefail
OUT=${OUT:-/tmp/e3j-device-out}
source "$(dirname "$0")/_device_common.sh"  # log, device_slug, snapshot_results, pack, run_e2e

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
log "install"
# e3j-cuda's CUDA target needs nvcc: on PATH, in /usr/local/cuda, or from the image's cuda-toolkit wheel
if ! command -v nvcc >/dev/null; then
  NVCC=$(ls /usr/local/cuda/bin/nvcc 2>/dev/null || find / -name nvcc -type f -perm -u+x 2>/dev/null | head -1)
  [ -n "$NVCC" ] && export CUDACXX="$NVCC" PATH="$(dirname "$NVCC"):$PATH"
fi
# the pure-Python packages first: a failed CUDA build must not cost the Pallas tests and benchmarks
python3 -m pip install -q --no-index --no-deps --no-build-isolation \
  packages/e3j-core packages/e3j-ops packages/e3j-pallas-gpu 2>&1 | tee -a "$OUT/log.txt"
[ "${PIPESTATUS[0]}" = 0 ] || exit 1
if python3 -c "import e3j_cuda._cuda" 2>/dev/null; then
  log "e3j-cuda: the prebuilt wheel from .whl"
else
  log "install e3j-cuda"
  # sm_90a only (H100/H200): one architecture keeps nvcc's share of the device time short
  CMAKE_ARGS="-DE3J_CUDA_ARCHITECTURES=90a-real" E3J_CUDA=ON python3 -m pip install -q --no-index --no-deps --no-build-isolation packages/e3j-cuda 2>&1 \
    | tee -a "$OUT/log.txt" | tail -20
  [ "${PIPESTATUS[0]}" = 0 ] || log "e3j-cuda FAILED to build: its tests and benchmarks will be missing"
fi
log "info"
python3 -m e3j info 2>&1 | tee "$OUT/info.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv >> "$OUT/info.txt" 2>&1
snapshot_results
# results files are named after the device, as paper_sizes.py and run_e2e name theirs
KIND=$(device_slug) || exit 1
if [ -n "${E3J_DEVICE_E2E:-}" ]; then
  E3J_DEVICE_STEPS=e2e
fi
STEPS=${E3J_DEVICE_STEPS:-tests table1 mosaic scaling fig1}
# seconds for a step: its own limit, or what is left of the budget (10 s kept for packing)
limit() {
  local left=$(( ${E3J_DEVICE_BUDGET:-570} - SECONDS - 10 ))
  (( left < $1 )) && echo $(( left > 0 ? left : 1 )) || echo "$1"
}
for step in $STEPS; do
  pack
  case $step in
  tests)
    log "tests/gpu ($(limit ${E3J_TESTS_TIMEOUT:-270}) s)"
    # compiling the unrolled kernels dominates (Triton takes ~10-70 s per lmax-3 kernel; see
    # benchmarks/results/sm90a-pallas-gpu-resources.json): spread the tests over processes sharing the GPU
    # (H200, 2026-11-30: 79 tests in 230 s on 8 processes, compile-bound)
    XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12")
    E3J_FAILURES_FILE="$OUT/failures.txt" XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$(limit ${E3J_TESTS_TIMEOUT:-270})" python3 -m pytest -q -rfE -m gpu -p no:cacheprovider $XDIST ${E3J_TESTS_ARGS:-} tests/gpu 2>&1 \
      | tee "$OUT/tests-gpu.txt" | tail -15
    ;;
  table1 | fig1)
    log "paper sizes: $step ($(limit 150) s)"
    if [ -n "${E3J_DEVICE_REHEARSAL:-}" ]; then
      python3 -m e3j bench --ops convolution --lmax 2 --channels 16 --elements 256 --degree 4 --runs 3 --jobs 2 \
        --json benchmarks/results/rehearsal.json --plot benchmarks/results/rehearsal.png --no-progress 2>&1 | tee -a "$OUT/log.txt"
    else
      # each suite writes its JSON row by row, so a timeout keeps rows. The kernel backends only: at these
      # sizes the reference and e3nn-jax (messages materialized: tens of GB) compile into out-of-memory
      # retries, 10 s each (seen on the H200), and measure nothing the goals need
      timeout "$(limit 150)" python3 benchmarks/paper_sizes.py --out benchmarks/results --suites "$step" --runs 20 --plot --jobs 12 \
        --backends $(python3 -c "import e3j; print(*[b.name for b in e3j.available_backends() if 'cuda' in b.platforms and b.auto and b.name != 'reference'])") \
        2>&1 | tail -40 | tee -a "$OUT/log.txt"
    fi
    ;;
  mosaic)
    [ -n "${E3J_DEVICE_REHEARSAL:-}" ] && continue
    log "Mosaic GPU vs Triton vs CUDA ($(limit 120) s)"
    # issue 17's goals for the Mosaic kernels (H200, lmax 3, float32, C >= 128), as fractions of the jitted
    # copy measured in the same run (fraction_of_copy in the JSON): TP fwd >= 85 %, conv fwd >= 75 %,
    # conv bwd >= 55 %. pallas_mosaic runs only on compute capability >= 9.0 (e3j info says why not).
    # C = 32: the Mosaic convolution's tiles of 4 nodes x 32 channels (issue 17; no padding to 128 lanes)
    timeout "$(limit 120)" python3 -m e3j bench --lmax 3 --channels ${E3J_MOSAIC_CHANNELS:-128 256 32} --sizes 16384 --degree 16 --runs 20 --jobs 12 \
      --backends $(python3 -c "import e3j; names = {b.name for b in e3j.available_backends()}; print(*[n for n in ('pallas_mosaic', 'pallas_gpu', 'cuda') if n in names])") --no-e3nn \
      --json "benchmarks/results/$KIND-mosaic-vs-triton-vs-cuda.json" --markdown "benchmarks/results/$KIND-mosaic-vs-triton-vs-cuda.md" \
      2>&1 | tail -40 | tee -a "$OUT/log.txt"
    ;;
  grouped)
    log "grouped kernels vs the groups' own ($(limit 480) s)"
    # issue 14: mixed multiplicities (64x0e + 32x1o + 16x2e x sh lmax 3, 27 neighbours) with e3nn's
    # [E, num_weights] weights read in place, against each group's kernels on operands already split;
    # the share of the grouped call spent beyond them (goal < 5 %). One JSON per backend, row by row;
    # pallas_mosaic's at 256x0e + 128x1o (its grouped kernels run groups of at most 64 channels on the
    # Triton kernels: the script's MOSAIC_IRREPS). Lowering the lmax-3 Mosaic kernels takes minutes:
    # run this step in a call of its own
    if [ -n "${E3J_DEVICE_REHEARSAL:-}" ]; then
      python3 benchmarks/grouped_kernel_parts.py --backend reference --nodes 100 --pairs 3 \
        --json benchmarks/results/rehearsal-grouped-kernel-parts.json 2>&1 | tee -a "$OUT/log.txt"
    else
      # Mosaic last, with whatever is left: its lmax-3 lowering takes the longest (cuda compiles
      # nothing at run time, Triton's grouped kernels compile in seconds)
      for backend in cuda pallas_gpu pallas_mosaic; do
        timeout "$(limit $(case $backend in cuda) echo 60 ;; pallas_gpu) echo 120 ;; *) echo 300 ;; esac))" python3 benchmarks/grouped_kernel_parts.py --backend $backend --nodes 3000 10000 --pairs 30 \
          --json "benchmarks/results/$KIND-grouped-kernel-parts-$backend.json" 2>&1 | tail -5 | tee -a "$OUT/log.txt"
      done
    fi
    ;;
  scaling)
    [ -n "${E3J_DEVICE_REHEARSAL:-}" ] && continue
    log "scaling in L ($(limit 60) s)"
    # issue 18: tensor product fwd/bwd vs lmax 1..8 on every GPU backend (records walked from lmax 4)
    timeout "$(limit 60)" python3 benchmarks/scaling_l.py --channels 128 --batch 16384 --runs 20 2>&1 | tail -30 | tee -a "$OUT/log.txt"
    ;;
  e2e)
    E3J_E2E_TIMEOUT=$(limit "${E3J_E2E_TIMEOUT:-420}") run_e2e || exit 1
    ;;
  diag)
    log "TP forward diagnosis ($(limit 90) s)"
    # the first H200 sweep timed the lmax-3 TP forward at 5.4 ms (7 % of a copy) while lowering threads held
    # the GIL (docs/gpu-performance.md): each backend's forward timed alone, back to back, beside a Python
    # thread and under the JAX profiler (kernel durations), with copies of 256 MiB to 2 GiB;
    # E3J_DIAG_ARGS adds e.g. --bwd (the backward as a control)
    if [ -n "${E3J_DEVICE_REHEARSAL:-}" ]; then
      python3 benchmarks/tp_fwd_diag.py --backends reference --lmax 2 --channels 16 --batch 256 --copy-bytes 4194304 \
        --runs 5 --stream 3 --bwd --out benchmarks/results/rehearsal-tp-fwd-diag.json 2>&1 | tee -a "$OUT/log.txt"
    else
      timeout "$(limit 90)" python3 benchmarks/tp_fwd_diag.py ${E3J_DIAG_ARGS:-} --out "benchmarks/results/$KIND-tp-fwd-diag.json" \
        2>&1 | grep -v Warning | tail -20 | tee -a "$OUT/log.txt"
    fi
    ;;
  *)
    log "unknown step $step (E3J_DEVICE_STEPS: tests table1 fig1 mosaic scaling e2e diag grouped)"
    exit 2
    ;;
  esac
done
pack
log "done"
