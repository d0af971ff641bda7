#!/usr/bin/env bash
# Dev (GPU machine): where the filter top-k kernel's time goes. Builds a -lineinfo variant of the CUDA
# library and writes ncu source counters per SASS line (<shape>_sass.csv, with stall sampling and
# executed instructions) and the details page (<shape>_details.txt) for each shape, all packed into
# $OUT/profile.tgz (only a few files come back from the device).
#   bash tools/profile_topk.sh [shapes as ROWSxWIDTH...]   (default: 4096x32768 1x131072)
# A shape ending in "pt" (4096x32768pt) profiles the page-table form (profile_topk.py runpt), one ending
# in "wl" topk given the form's lengths (runpt ROWS WIDTH 2048 0).
# With TRACE=1 it also builds a -DDSA_TOPK_TRACE variant and records, per phase, the SM clock cycles
# since the previous phase of every 512th CTA (trace.log, medians in trace_summary.txt). TRACE=only: that
# alone, TRACE_PASSES times (default 1), no ncu.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dsa_out}; P=/tmp/dsa_profile; rm -rf "$P"; mkdir -p "$P"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "root' user" | tail -3
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
if [[ "${TRACE:-0}" != only ]]; then
  python3 tools/profile_topk.py build "-lineinfo" > "$P/build_line.log" 2>&1
  LINE_SO=$(tail -1 "$P/build_line.log")
fi
if [[ "${TRACE:-0}" != 0 ]]; then
  python3 tools/profile_topk.py build "-DDSA_TOPK_TRACE" > "$P/build_trace.log" 2>&1
  for _ in $(seq "${TRACE_PASSES:-1}"); do
    DSA_OPS_CUDA_LIB=$(tail -1 "$P/build_trace.log") python3 tools/profile_topk.py trace >> "$P/trace.log" 2>&1
  done
  python3 - "$P/trace.log" <<'PY' | tee "$P/trace_summary.txt"
import collections, sys
shape, acc = None, collections.OrderedDict()
for line in open(sys.argv[1]):
    p = line.split()
    if line.startswith("# shape"):
        shape = p[2]
    elif len(p) >= 4 and p[0] == "trace":
        acc.setdefault((shape, p[2]), []).append(int(p[3]))
for (s, ph), v in acc.items():
    v.sort()
    print(f"{s:>12} ->{ph:10} median {v[len(v) // 2]:8d} cycles ({v[len(v) // 2] / 1980:6.2f} us at 1.98 GHz), n={len(v)}")
PY
  if [[ "${TRACE}" == only ]]; then
    cp "$P/trace.log" "$P/trace_summary.txt" "$OUT/"
    exit 0
  fi
fi
for shape in ${*:-4096x32768 1x131072}; do
  rows=${shape%x*}; width=${shape#*x}; what=run; more=()
  if [[ "$width" == *pt ]]; then width=${width%pt}; what=runpt; fi
  if [[ "$width" == *wl ]]; then width=${width%wl}; what=runpt; more=(2048 0); fi
  DSA_OPS_CUDA_LIB=$LINE_SO timeout 240 "$NCU" --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --import-source yes \
    -k regex:topk_filter --launch-skip 2 --launch-count 1 -f -o "$P/$shape" \
    python3 tools/profile_topk.py $what "$rows" "$width" "${more[@]}" > "$P/${shape}_ncu.log" 2>&1
  "$NCU" -i "$P/$shape.ncu-rep" --page details > "$P/${shape}_details.txt" 2>&1
  "$NCU" -i "$P/$shape.ncu-rep" --page source --csv --print-source sass > "$P/${shape}_sass.csv" 2>&1
  echo "$shape: $(wc -l < "$P/${shape}_sass.csv") sass lines"
  grep -E "Duration|Issue Slots Busy|Executed Ipc A|DRAM Throughput" "$P/${shape}_details.txt" | head
  rm -f "$P/$shape.ncu-rep"
done
tar czf "$OUT/profile.tgz" -C /tmp dsa_profile
