#pragma once

/// \file
/// unison's CUDA kernels: multi-tensor pack/unpack with scale and cast, average-
/// and-cast, multi-tensor L2 norm with the inf/nan check, fused optimizer steps on
/// flat shards, and the device reduction of the thread backend. Include from a .cu
/// file compiled by nvcc and link `unison::cuda`; the element math they share with
/// the host paths is in unison/kernels/element.hpp.

#include "unison/kernels/multi_tensor.cuh"
#include "unison/kernels/norm.cuh"
#include "unison/kernels/optimizer.cuh"
#include "unison/kernels/reduce.cuh"
