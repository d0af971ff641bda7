// The filter kernel's narrow shape (256 threads, four CTAs an SM on sm_90, one CTA a row): the same source as
// topk_filter.cu, in its own namespace and translation unit (built in parallel with the wide one).
// Torch-free: the compile gates build this file alone with nvcc.
#define DSA_TOPK_FILTER_NARROW 1
#include "topk_filter.cu"
