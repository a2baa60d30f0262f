#pragma once

/// \file
/// Version and feature macros. Code that needs CUDA, NCCL, MPI or Gloo is guarded by the
/// function-style macros below, so a CPU-only build never sees it:
/// `#if UNISON_HAS_CUDA()`. The version macros come from unison/version.hpp.

#include "unison/version.hpp"

/// True inside a translation unit compiled by a CUDA compiler (nvcc, clang CUDA):
/// kernels can be defined and launched. Only kernels/, thread/device.cuh and
/// parallel/device.cuh depend on it; the classes of ddp/ and sharded/ compile the
/// same in every translation unit.
#if defined(__CUDACC__)
#define UNISON_CUDA_COMPILATION() 1
#else
#define UNISON_CUDA_COMPILATION() 0
#endif

/// True where the CUDA runtime API (cudart) is available: in a CUDA translation
/// unit, or in one whose target links `unison::cuda` (which defines
/// UNISON_WITH_CUDA). No kernels can be launched from the latter.
#if UNISON_CUDA_COMPILATION() || defined(UNISON_WITH_CUDA)
#define UNISON_HAS_CUDA() 1
#else
#define UNISON_HAS_CUDA() 0
#endif

/// True when the consumer linked `unison::nccl` (which defines UNISON_WITH_NCCL).
#if defined(UNISON_WITH_NCCL)
#define UNISON_HAS_NCCL() 1
#else
#define UNISON_HAS_NCCL() 0
#endif

/// True when the consumer linked `unison::mpi` (which defines UNISON_WITH_MPI).
#if defined(UNISON_WITH_MPI)
#define UNISON_HAS_MPI() 1
#else
#define UNISON_HAS_MPI() 0
#endif

/// True when the consumer linked `unison::gloo` (which defines UNISON_WITH_GLOO).
#if defined(UNISON_WITH_GLOO)
#define UNISON_HAS_GLOO() 1
#else
#define UNISON_HAS_GLOO() 0
#endif

/// Marks functions usable from both host and device code.
#if UNISON_CUDA_COMPILATION()
#define UNISON_HOST_DEVICE __host__ __device__
#else
#define UNISON_HOST_DEVICE
#endif
