#!/usr/bin/env bash
# Builds the CUDA library for one arch on a machine without a GPU (or a CUDA build of torch), for a GPU machine to
# load with DSA_OPS_CUDA_LIB: the GPU machine then skips its ~60 s build.
#   bash tools/build_cuda_lib_on_cpu.sh [arch] [out.so]      # default sm_90a, ./dsa_ops_cuda_sm90a.so
# cuda.build() compiles every object here (nvcc only needs the CUDA toolkit and torch's headers) but cannot link:
# a CPU torch has no libc10_cuda / libtorch_cuda. The library takes one symbol from them
# (aoti_torch_get_current_cuda_stream, libtorch_cuda), so it is linked against stubs with those sonames and
# --as-needed: its DT_NEEDED list and stable-ABI imports are those of a library built on the GPU machine. An sm_90a
# library linked this way (torch 2.13 CPU here) loaded on an H100 with torch 2.11 + CUDA 13.0 and passed the indexer
# GPU tests and the benchmarks' checks. The stubs are never loaded there: torch has loaded the real libraries.
set -euo pipefail
arch=${1:-sm_90a}
root=${BUILD_ROOT:-/tmp/dsa_cpu_build}
py=${PYTHON:-python3}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# The library's name and build folder, as cuda.build names them.
read -r name dir < <("$py" -c "from dsa_ops.backends import cuda; s = cuda.build_spec('$arch'); \
print(s.name, cuda.LIB.build_dir(s, '$root'))")
out=${2:-$PWD/$name.so}
MAX_JOBS=${MAX_JOBS:-2} "$py" -c \
  "from dsa_ops.backends import cuda; cuda.build(build_root='$root', arch='$arch')" >"$root.log" 2>&1 || true
objs=$(sed -n "s/^build $name.so: link //p" "$dir/build.ninja")
[[ -n $objs ]] || { echo "no link line in $dir/build.ninja; see $root.log" >&2; exit 1; }
for o in $objs; do [[ -f $dir/$o ]] || { echo "compile failed ($o missing); see $root.log" >&2; exit 1; }; done
stub=$dir/stub && mkdir -p "$stub"
echo 'extern "C" int aoti_torch_get_current_cuda_stream(int, void**) { return 0; }' >"$stub/torch_cuda.cpp"
echo 'int dsa_ops_c10_cuda_stub;' >"$stub/c10_cuda.cpp"
c++ -shared -fPIC -Wl,-soname,libtorch_cuda.so -o "$stub/libtorch_cuda.so" "$stub/torch_cuda.cpp"
c++ -shared -fPIC -Wl,-soname,libc10_cuda.so -o "$stub/libc10_cuda.so" "$stub/c10_cuda.cpp"
torch_lib=$("$py" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
(cd "$dir" && c++ -o "$out" $objs -shared -Wl,--as-needed -Wl,--exclude-libs,ALL -L"$torch_lib" -L"$stub" \
  -lc10 -lc10_cuda -ltorch_cpu -ltorch_cuda -ltorch -ltorch_python -L"$CUDA_HOME/lib64" -lcudart)
echo "$out"
readelf -d "$out" | grep NEEDED
