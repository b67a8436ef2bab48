#!/usr/bin/env bash
# One prepared run on a TPU VM: install the packages from this checkout (with e3j-pallas-tpu), e3j
# info, the TPU tests, the op benchmarks at the paper's sizes (pallas_tpu against the reference), then
# the end-to-end benchmarks with a short MD per backend (bounded in time); results under $OUT.
#
# On a TPU VM (Python 3.12; the e3j packages go into this environment, so use a fresh one):
#   python3 -m venv ~/e3j && . ~/e3j/bin/activate
#   pip install "jax[tpu]==0.11.2" e3nn-jax==0.21.0 flax ase vesin tqdm matplotlib pytest hypothesis hatchling
#   bash benchmarks/tpu.sh               # OUT=/some/dir to choose where the results go
# Steps are bounded by timeouts (tests 600 s, op benchmarks 900 s, end to end 420 s; tens of minutes
# in all), and results.tgz is repacked after each, so a run cut short keeps what it measured. Unpack
# $OUT/results.tgz in the checkout, then `python benchmarks/readme_tables.py --write`.
#
# Rehearse on a CPU machine with E3J_DEVICE_REHEARSAL=1 (same packages, plain jax): the same steps
# with pallas_tpu in Pallas's TPU interpreter (pallas_tpu_interpret) and small sizes.
set -uo pipefail
OUT=${OUT:-/tmp/e3j-tpu-out}
source "$(dirname "$0")/_device_common.sh"  # log, device_slug, snapshot_results, pack, run_e2e
REHEARSAL=${E3J_DEVICE_REHEARSAL:-}

log "install"
python3 -m pip install -q --no-index --no-deps --no-build-isolation \
  packages/e3j-core packages/e3j-ops packages/e3j-pallas-tpu 2>&1 | tee -a "$OUT/log.txt"
[ "${PIPESTATUS[0]}" = 0 ] || exit 1
log "info"
python3 -m e3j info 2>&1 | tee "$OUT/info.txt"
python3 -c "import jax; print(jax.devices())" >> "$OUT/info.txt" 2>&1
PLATFORM=$(python3 -c "import jax; print(jax.default_backend())")
if [ -z "$REHEARSAL" ] && [ "$PLATFORM" != tpu ]; then
  log "JAX sees no TPU (default backend: $PLATFORM): pip install 'jax[tpu]', or E3J_DEVICE_REHEARSAL=1 on a CPU"
  exit 1
fi
snapshot_results

log "tests/tpu tests/pallas_tpu"
# tests/tpu: pallas_tpu on the chip against the reference (skipped without a TPU); tests/pallas_tpu:
# the same kernels in the TPU interpreter, and their Mosaic lowering
# the rehearsal keeps the quick half of tests/pallas_tpu (lowering, descriptors, VMEM budgets): its 40
# interpreter tests take ~12 min on 2 CPU cores (they run in `nox -s tests` anyway)
[ -n "$REHEARSAL" ] && QUICK=(-k "test_tpu_backend or lowers or descriptors or vmem or lanes or multiple_of_8 or buffer_bytes") || QUICK=()
timeout 600 python3 -m pytest -q -p no:cacheprovider -rs tests/tpu tests/pallas_tpu "${QUICK[@]}" 2>&1 | tee "$OUT/tests-tpu.txt" | tail -8

log "op benchmarks"
if [ -n "$REHEARSAL" ]; then
  timeout 300 python3 -m e3j bench --lmax 2 --channels 16 --elements 256 --degree 4 --runs 3 \
    --backends pallas_tpu_interpret reference --no-e3nn --no-progress \
    --json benchmarks/results/rehearsal-tpu.json --markdown benchmarks/results/rehearsal-tpu.md 2>&1 | tee -a "$OUT/log.txt"
else
  # Table 1 first (the issues' goals), then Fig. 1; each writes its JSON row by row, so a timeout keeps rows
  timeout 900 python3 benchmarks/paper_sizes.py --out benchmarks/results --suites table1 fig1 --runs 20 --plot \
    --backends pallas_tpu reference 2>&1 | tail -40 | tee -a "$OUT/log.txt"
fi
pack

if [ -n "$REHEARSAL" ]; then
  # the interpreter evaluates each kernel op by op (~25 s per MD step of 32 atoms here): the smallest sizes
  E3J_E2E_BACKENDS=${E3J_E2E_BACKENDS:-pallas_tpu_interpret} run_e2e || exit 1
else
  run_e2e || exit 1
fi
pack
log "done"
