#!/usr/bin/env bash
# One device call: build, test, sanitize and time everything on the GPU machine, logs under $OUT.
#   bash benchmarks/device_run.sh [stages...]     stages: build test bench sanitize (default: all), keepso
# TESTS / BENCH narrow the test and benchmark files (default: tests, benchmarks/bench_*.py), SANITIZE the
# compute-sanitizer runs (below), e.g.
#   TESTS=tests/test_gpu_topk.py BENCH=benchmarks/bench_topk.py bash benchmarks/device_run.sh build test bench
# With `keepso` the built extensions are copied to $OUT; carry them back in as backends_*/prebuilt/ to
# skip the build next time (leave out the build stage: it always builds). tools/build_cuda_lib_on_cpu.sh makes
# the CUDA one on a machine without a GPU, from the tree's sources, for the same use. The results and the test
# summary record the tree's commit: `git describe`, or DSA_OPS_COMMIT where the copy on the GPU machine has no .git.
# More than 8 files under $OUT end as one archive, $OUT/device_run.tgz (the GPU machine hands back 8 at most).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/dsa_out}; mkdir -p "$OUT"
stages=${*:-build test bench sanitize}
has() { [[ " $stages " == *" $1 "* ]]; }
log() { echo "== $(date +%T) $*"; }
DSA_OPS_COMMIT=${DSA_OPS_COMMIT:-$(git describe --always --dirty --abbrev=7 2>/dev/null || echo "unknown (no git checkout; set DSA_OPS_COMMIT)")}
export DSA_OPS_COMMIT

log "setup"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | cat
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "root' user" | tail -3
python3 -m dsa_ops info 2>&1

if has build; then
  log "build (ninja, 16 cores)"
  KEEP_SO=$(has keepso && echo 1) MAX_JOBS=16 python3 - <<'PY' 2>&1 | tee "$OUT/build.log"
import os, shutil, time, dsa_ops
for name in ("cuda", "rocm"):
    mod = getattr(__import__("dsa_ops.backends", fromlist=[name]), name)
    if not hasattr(mod, "build"):
        continue
    t = time.time()
    path = mod.build(verbose=True)
    print(f"built {name}: {path} in {time.time() - t:.1f} s")
    if os.environ.get("KEEP_SO") == "1":
        shutil.copy(path, os.path.join(os.environ["OUT"], os.path.basename(path)))
PY
fi

rc=0
if has test; then
  log "GPU tests"
  test_cmd="python3 -m pytest -m gpu ${TESTS:-tests} -q -ra -p no:cacheprovider --junitxml=/tmp/gpu_tests.xml"
  $test_cmd 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
  rc=${PIPESTATUS[0]}
  python3 benchmarks/gpu_test_summary.py /tmp/gpu_tests.xml "$OUT/gpu_tests_summary.md" \
    --command "${TESTS:+TESTS=\"$TESTS\" }bash benchmarks/device_run.sh $stages (test stage: $test_cmd)" --commit "$DSA_OPS_COMMIT"
fi

if has bench; then
  log "benchmarks"
  python3 -m pytest ${BENCH:-benchmarks/bench_*.py} -m gpu -q -s -p no:cacheprovider --dsa-results "$OUT/h200.json" \
    --benchmark-json /tmp/pytest_benchmark.json 2>&1 | tee "$OUT/bench.log" | grep -E "^  |passed|failed|error" | tail -80
  [[ -s "$OUT/h200.json" ]] && python3 benchmarks/goals_topk.py "$OUT/h200.json" 2>&1 | tee "$OUT/goals_topk.md"
fi

if has sanitize; then
  log "compute-sanitizer"
  # Every top-k path: default (shared-memory, cluster split, short windows), one CTA per row
  # (sampled threshold), and no sampling (streamed radix passes, candidate copy, 4-read rescan).
  # SANITIZE picks runs as tool[:mode], mode's commas standing for spaces, e.g. SANITIZE="memcheck
  # racecheck:DSA_OPS_TOPK_CLUSTER=4" (racecheck takes 100-150 s a run: six runs outlast one call).
  default_runs="memcheck racecheck memcheck:DSA_OPS_TOPK_CLUSTER=1 racecheck:DSA_OPS_TOPK_CLUSTER=1"
  default_runs+=" memcheck:DSA_OPS_TOPK_CLUSTER=1,DSA_OPS_TOPK_SAMPLE=0 racecheck:DSA_OPS_TOPK_CLUSTER=1,DSA_OPS_TOPK_SAMPLE=0"
  for run in ${SANITIZE:-$default_runs}; do
    tool=${run%%:*}
    mode=$([[ $run == *:* ]] && echo "${run#*:}" | tr , ' ')
    f="$OUT/sanitizer.log"
    echo "--- $tool ${mode:-default}" >> "$f"
    env $mode timeout ${SANITIZE_TIMEOUT:-150} compute-sanitizer --tool "$tool" --error-exitcode 9 \
      python3 tools/sanitize_small.py >> "$f" 2>&1
    echo "compute-sanitizer $tool [${mode:-default}] exit $?: $(tail -2 "$f" | tr '\n' ' ')"
  done
fi
# The GPU machine hands back at most 8 files from $OUT: past that, one archive of them all.
if (( $(find "$OUT" -maxdepth 1 -type f | wc -l) > 8 )); then
  tar -czf /tmp/device_run.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/device_run.tgz "$OUT/"
  log "more than 8 files: bundled into $OUT/device_run.tgz"
fi
log "done (tests rc=$rc)"
exit $rc
