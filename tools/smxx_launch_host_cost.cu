// Host time of one kernel launch through each launch API (no torch): what a dsa_ops binding pays for its
// launch, apart from the dispatcher. Plain nvcc:
//   nvcc -O2 -arch=sm_90a -Ibackends_cuda/include -o /tmp/launch_host_cost tools/smxx_launch_host_cost.cu
//   /tmp/launch_host_cost [batches]
// Each variant launches an empty kernel whose parameter block is the size of the top-k kernels'
// (KernelArgs, ~220 bytes) 100 times back to back, then synchronises; the variants' batches are taken
// in turn so that a change of the host's pace meets all alike. Prints the median and min per launch (us).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <unistd.h>  // environ
#include <vector>

#include "dsa_cuda/common_launch.cuh"  // launch_detail: the library's attribute fill and driver entry point

struct Params {
  char bytes[224];
};

__global__ void empty_kernel(Params p) {
  if (p.bytes[0] == 123 && threadIdx.x == 1000) {
    asm volatile("trap;");  // never: keeps the parameter live
  }
}

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

int main(int argc, char** argv) {
  namespace launch_detail = dsa_cuda::launch_detail;
  const int batches = argc > 1 ? std::atoi(argv[1]) : 40;
  constexpr int kCalls = 100;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Params p = {};
  const dim3 grid(8), block(1024);

  auto launch_ex = [&](unsigned cluster, bool pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = stream;
    cudaLaunchAttribute attrs[2];
    const unsigned n = launch_detail::fill_attributes(attrs, pdl, int(cluster),
                                                      cudaLaunchAttributeProgrammaticStreamSerialization,
                                                      cudaLaunchAttributeClusterDimension);
    cfg.attrs = n ? attrs : nullptr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, empty_kernel, p);
  };

  // The driver entry point, with the CUfunction looked up once (what cudart does on every launch).
  const launch_detail::DriverLaunch cu_launch_ex = launch_detail::driver_launch();
  cudaFunction_t fn;
  CHECK(cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(empty_kernel)));
  if (cu_launch_ex == nullptr) {
    std::printf("the driver gives no cuLaunchKernelEx\n");
    return 1;
  }
  auto launch_driver = [&](unsigned cluster, bool pdl) {
    CUlaunchConfig cfg = {};
    cfg.gridDimX = grid.x;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = block.x;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = stream;
    CUlaunchAttribute attrs[2];
    const unsigned n = launch_detail::fill_attributes(attrs, pdl, int(cluster),
                                                      CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                                                      CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
    cfg.attrs = n ? attrs : nullptr;
    cfg.numAttrs = n;
    void* args[] = {&p};
    return cu_launch_ex(&cfg, reinterpret_cast<CUfunction>(fn), args, nullptr) == CUDA_SUCCESS ? cudaSuccess
                                                                                              : cudaErrorUnknown;
  };

  int device = 0;
  std::vector<std::pair<std::string, std::function<cudaError_t()>>> variants = {
      {"<<<>>> (cudaLaunchKernel)", [&] {
         empty_kernel<<<grid, block, 0, stream>>>(p);
         return cudaGetLastError();
       }},
      {"cudaLaunchKernelEx, no attribute", [&] { return launch_ex(1, false); }},
      {"cudaLaunchKernelEx + PDL", [&] { return launch_ex(1, true); }},
      {"cudaLaunchKernelEx + cluster 8", [&] { return launch_ex(8, false); }},
      {"cudaLaunchKernelEx + PDL + cluster 8 (topk decode)", [&] { return launch_ex(8, true); }},
      {"cuLaunchKernelEx + PDL (function cached)", [&] { return launch_driver(1, true); }},
      {"cuLaunchKernelEx + PDL + cluster 8 (function cached)", [&] { return launch_driver(8, true); }},
      {"cudaGetDevice x4 (no launch)", [&] {
         for (int i = 0; i < 4; ++i) CHECK(cudaGetDevice(&device));
         return cudaSuccess;
       }},
      {"getenv x3, unset names (the top-k launcher's overrides)", [&] {
         const char* a = std::getenv("DSA_OPS_TOPK_CLUSTER");
         const char* b = std::getenv("DSA_OPS_TOPK_CLUSTER");
         const char* c = std::getenv("DSA_OPS_TOPK_SAMPLE");
         return a == nullptr && b == nullptr && c == nullptr ? cudaSuccess : cudaErrorUnknown;
       }},
  };
  std::vector<std::vector<double>> got(variants.size());
  for (int b = -3; b < batches; ++b) {  // (3 warm-up rounds)
    for (size_t v = 0; v < variants.size(); ++v) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kCalls; ++i) {
        CHECK(variants[v].second());
      }
      const auto t1 = std::chrono::steady_clock::now();
      CHECK(cudaStreamSynchronize(stream));
      if (b >= 0) {
        got[v].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kCalls);
      }
    }
  }
  int env_vars = 0;
  for (char** e = environ; *e != nullptr; ++e) {
    ++env_vars;
  }
  std::printf("%d environment variables\n", env_vars);
  std::printf("%-56s %9s %9s  (us per call, %d batches of %d)\n", "variant", "median", "min", batches, kCalls);
  for (size_t v = 0; v < variants.size(); ++v) {
    auto& g = got[v];
    std::sort(g.begin(), g.end());
    std::printf("%-56s %9.3f %9.3f\n", variants[v].first.c_str(), g[g.size() / 2], g[0]);
  }
  return 0;
}
