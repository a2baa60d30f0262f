#pragma once

/// \file
/// FSDP and ZeRO: the sharding engine `fsdp`, the parts it is built from (sharded
/// parameters, partitioned optimizer state), their policies and options, and sharded
/// checkpoints (the optimizers are in unison/optim.hpp).

#include "unison/optim.hpp"
#include "unison/sharded/checkpoint.hpp"
#include "unison/sharded/fsdp.hpp"
#include "unison/sharded/options.hpp"
#include "unison/sharded/partitioned_optimizer.hpp"
#include "unison/sharded/policies.hpp"
#include "unison/sharded/sharded_parameters.hpp"
