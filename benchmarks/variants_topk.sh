#!/usr/bin/env bash
# Dev, on the GPU machine: time variants of the filter top-k kernel against each other in one call.
#   bash benchmarks/variants_topk.sh A B ...   each .variants/<name>.cu is a whole kernels/topk_filter.cu
# Each variant is built into its own library (the JIT cache is keyed by the sources), then
# `python benchmarks/probe_topk.py ${PROBE:-shapes}` times it in a fresh process with DSA_OPS_CUDA_LIB
# pointing at it, ${PASSES:-2} passes interleaved. Build logs go to $OUT/build_<name>.log.
# (.variants/ is a scratch folder ignored by git: name it in the device tool's `carry`.)
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
cp backends_cuda/kernels/topk_filter.cu /tmp/topk_filter_kept.cu
for v in "$@"; do
  cp ".variants/$v.cu" backends_cuda/kernels/topk_filter.cu
  MAX_JOBS=16 python3 -c "from dsa_ops.backends import cuda; import shutil; shutil.copy(cuda.build(), '/tmp/$v.so')" \
    > "$OUT/build_$v.log" 2>&1 || echo "build $v failed"
done
cp /tmp/topk_filter_kept.cu backends_cuda/kernels/topk_filter.cu
for rep in $(seq "${PASSES:-2}"); do
  for v in "$@"; do
    echo -n "$v: "
    DSA_OPS_CUDA_LIB=/tmp/$v.so python3 benchmarks/probe_topk.py "${PROBE:-shapes}" 2>&1 | tail -1
  done
done
