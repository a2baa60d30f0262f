#pragma once

/// \file
/// FSDP and ZeRO: sharded parameters, partitioned optimizer state, their policies
/// and optimizers, and sharded checkpoints.

#include "unison/sharded/checkpoint.hpp"
#include "unison/sharded/optimizers.hpp"
#include "unison/sharded/partitioned_optimizer.hpp"
#include "unison/sharded/policies.hpp"
#include "unison/sharded/sharded_parameters.hpp"
