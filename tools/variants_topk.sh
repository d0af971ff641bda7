#!/usr/bin/env bash
# Times variants of the filter top-k kernel against each other in one device call (each variant in a
# fresh process, passes interleaved): the way to judge a kernel change against the old kernel in one run.
#   bash tools/variants_topk.sh A B ...
# A variant is either
#   NAME                    .variants/NAME.cu, a whole kernels/topk_filter.cu, swapped in (headers: the tree's)
#   NAME=P1[,P2...]         the tree with these patches applied (`git apply`, any files; none: the tree as is),
#                           e.g. main= ll=/tmp/lean_lookups.patch
#                           A P that is a folder is an overlay: its files replace the tree's at the same paths
#                           (for a machine without git).
#   NAME=@LIB.so            a library built before (e.g. brought back from an earlier call), not rebuilt
# Each variant is built into its own library (the JIT cache is keyed by the sources), then
# `python tools/probe_topk.py ${PROBE:-shapes}` times it in a fresh process with DSA_OPS_CUDA_LIB
# pointing at it, ${PASSES:-2} passes interleaved. Build logs go to $OUT/build_<name>.log.
# (.variants/ is a scratch folder at the repository root, not committed.)
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
cp backends_cuda/kernels/topk_filter.cu /tmp/topk_filter_kept.cu
names=()
for v in "$@"; do
  name=${v%%=*}
  names+=("$name")
  if [[ $v == *=@* ]]; then
    cp "${v#*=@}" "/tmp/$name.so" || echo "no library ${v#*=@} for $name"
    continue
  fi
  patches=()
  if [[ $v == *=* ]]; then
    IFS=, read -r -a patches <<< "${v#*=}"
  else
    cp ".variants/$v.cu" backends_cuda/kernels/topk_filter.cu
  fi
  ok=1
  for p in "${patches[@]}"; do
    if [ -d "$p" ]; then
      (cd "$p" && find . -type f) | while read -r f; do cp "$f" "/tmp/kept_${f//\//_}" 2>/dev/null; cp "$p/$f" "$f"; done
    else
      git apply "$p" || { echo "patch $p of $name does not apply"; ok=0; }
    fi
  done
  if [ $ok = 1 ]; then
    MAX_JOBS=16 python3 -c "from dsa_ops.backends import cuda; import shutil; shutil.copy(cuda.build(), '/tmp/$name.so')" \
      > "$OUT/build_$name.log" 2>&1 || echo "build $name failed"
  fi
  for ((i = ${#patches[@]} - 1; i >= 0; i--)); do
    p=${patches[i]}
    if [ -d "$p" ]; then
      (cd "$p" && find . -type f) | while read -r f; do cp "/tmp/kept_${f//\//_}" "$f"; done
    else
      git apply -R "$p" 2>/dev/null
    fi
  done
  cp /tmp/topk_filter_kept.cu backends_cuda/kernels/topk_filter.cu
done
for rep in $(seq "${PASSES:-2}"); do
  for name in "${names[@]}"; do
    echo -n "$name: "
    DSA_OPS_CUDA_LIB=/tmp/$name.so python3 tools/probe_topk.py "${PROBE:-shapes}" 2>&1 | tail -1
  done
done
