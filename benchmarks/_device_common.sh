# Shared by benchmarks/device.sh (GPU) and benchmarks/tpu.sh (TPU); sourced, not run. It sets $OUT
# (the caller's default if unset), log(), device_slug(), snapshot_results() / pack() (the results
# files so far into $OUT/results.tgz) and run_e2e (the end-to-end benchmarks of e3j-models).
OUT=${OUT:-/tmp/e3j-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
# the device's name in results files (nvidia-h200, tpu-v5-lite, cpu): e3j's rule, as paper_sizes.py and
# scaling_l.py name theirs; needs e3j installed
device_slug() { python3 -c "from e3j._bench import device_slug; print(device_slug())"; }

# results land in this copy's benchmarks/results (so the recorded commands name the committed paths);
# unpack results.tgz in the checkout (it holds rewritten committed files too: read `git diff` before
# committing), then: python benchmarks/readme_tables.py --write (renders docs/benchmarks.md)
snapshot_results() {
  RESULTS_MARK=$(mktemp)
  sleep 1  # a file written in the marker's second must still count as newer
}
# packed after every step: a run cut short by a time limit still returns what it measured. Every file
# written since the snapshot, new or rewritten (a rerun rewrites the committed results of the same name)
pack() {
  find benchmarks/results -type f -newer "$RESULTS_MARK" | tar czf "$OUT/results.tgz" -T -
}

# e3j-models force time vs atoms, MD ms/step per backend and the e3nn-jax twin, run-to-run deviation
# (issue 16), bounded to $E3J_E2E_TIMEOUT seconds (default 420). The backends: $E3J_E2E_BACKENDS, else
# every automatic backend of this platform that is compatible and loads (e3j._bench.runnable_backends;
# the interpreters, which run kernels op by op in Python, run only by name).
run_e2e() {
  log "end to end (e3j-models)"
  python3 -m pip install -q --no-index --no-deps --no-build-isolation packages/e3j-models 2>&1 | tee -a "$OUT/log.txt"
  if ! python3 -c "import flax, ase, vesin, e3nn_jax" 2>>"$OUT/log.txt"; then
    log "e3j-models' dependencies (flax, ase, vesin, e3nn-jax) are missing (see the header of $0)"
    return 1
  fi
  local backends kind
  backends=${E3J_E2E_BACKENDS:-$(python3 -c "from e3j._bench import runnable_backends; print(*runnable_backends() or ['reference'])")}
  kind=$(device_slug) || return 1
  log "backends: $backends e3nn ($kind)"
  local sizes out="benchmarks/results/$kind-e2e.json"
  if [ -n "${E3J_DEVICE_REHEARSAL:-}" ]; then
    sizes=(--models nequip --atoms 30 --runs 2 --md cuni_mace:2 --md-steps 2 --md-rounds 1 --repeats 2 --determinism cuni_nequip)
    out="benchmarks/results/rehearsal-$kind-e2e.json"  # on a CPU, $kind-e2e.json is the committed cpu-e2e.json
  elif [ -n "${E3J_E2E_ARGS:-}" ]; then
    # another selection of sections and sizes, e.g. only what a bounded run cut (the sections run in
    # the order md, determinism, forces): E3J_E2E_ARGS="--md --determinism cuni_mace --models mace_a
    # mace_b nequip --atoms 1000 4000 --runs 10 --repeats 20" E3J_E2E_OUT=benchmarks/results/nvidia-h200-e2e-forces.json
    read -r -a sizes <<< "$E3J_E2E_ARGS"
    out=${E3J_E2E_OUT:-$out}
  else
    sizes=(--models mace_a mace_b nequip --atoms 1000 4000 --runs 10 --md cuni_mace:8 mace_a:8 --md-steps 20 --md-rounds 2 --repeats 20)
    out=${E3J_E2E_OUT:-$out}
  fi
  # sections are written as they finish (md, determinism, forces): a timeout keeps what ran
  timeout "${E3J_E2E_TIMEOUT:-420}" python3 benchmarks/e2e.py "${sizes[@]}" --backends $backends e3nn --out "$out" \
    2>&1 | grep -v Warning | tail -60 | tee -a "$OUT/log.txt"
  local rc=${PIPESTATUS[0]}
  pack
  # a timeout (124) keeps the sections written so far; any other failure is the caller's to see
  [ "$rc" = 124 ] && log "end to end: stopped at ${E3J_E2E_TIMEOUT:-420} s (finished sections kept)"
  [ "$rc" = 0 ] || [ "$rc" = 124 ] || { log "end to end FAILED (exit $rc)"; return "$rc"; }
}
