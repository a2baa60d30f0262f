#pragma once

/// \file
/// unison's LibTorch layer (link `unison::torch`): `torch::Tensor` as a unison
/// tensor (core/torch.hpp) and data parallelism for a `torch::nn::Module`
/// (torch/ddp.hpp), fully sharded data parallelism and ZeRO for one (torch/fsdp.hpp;
/// what the model's own code calls for it: torch/units.hpp), and activation
/// recomputation of a block (torch/recompute.hpp).

#include "unison/core/torch.hpp"
#include "unison/torch/ddp.hpp"
#include "unison/torch/fsdp.hpp"
#include "unison/torch/recompute.hpp"
#include "unison/torch/units.hpp"
