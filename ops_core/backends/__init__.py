"""Device backends: dsa_ops.backends.cuda (CUDA C++), .rocm (native HIP), .triton (Triton)."""
