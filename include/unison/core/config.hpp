#pragma once

/// \file
/// Version and feature macros. Code that needs CUDA, NCCL or MPI is guarded by the
/// function-style macros below, so a CPU-only build never sees it:
/// `#if UNISON_HAS_CUDA()`.

#define UNISON_VERSION_MAJOR 0
#define UNISON_VERSION_MINOR 1
#define UNISON_VERSION_PATCH 0

/// True inside a translation unit compiled by nvcc (or clang CUDA).
#if defined(__CUDACC__)
#define UNISON_HAS_CUDA() 1
#elif defined(UNISON_WITH_CUDA)
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

/// The inline namespace of the parts whose code differs between translation units
/// compiled by nvcc (which launch kernels on device state) and by a host compiler
/// (which cannot): bucketed_reducer, ddp, sharded_parameters, partitioned_optimizer
/// and their memory helpers. A program that mixes .cpp and .cu translation units
/// then links two sets of symbols instead of one silently replacing the other.
/// Users never name it (`unison::ddp` finds it); objects must not cross between the
/// two kinds of translation unit.
#if defined(__CUDACC__)
#define UNISON_TU_ABI cuda_tu
#else
#define UNISON_TU_ABI host_tu
#endif

/// Marks functions usable from both host and device code.
#if defined(__CUDACC__)
#define UNISON_HOST_DEVICE __host__ __device__
#else
#define UNISON_HOST_DEVICE
#endif
