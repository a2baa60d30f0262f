#pragma once

/// \file
/// unison's LibTorch layer (link `unison::torch`): `torch::Tensor` as a unison
/// tensor (core/torch.hpp) and data parallelism for a `torch::nn::Module`
/// (torch/ddp.hpp).

#include "unison/core/torch.hpp"
#include "unison/torch/ddp.hpp"
