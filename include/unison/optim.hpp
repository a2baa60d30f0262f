#pragma once

/// \file
/// Optimizers as element math on flat shards: SGD with momentum, Adam and AdamW.

#include "unison/optim/adam.hpp"
#include "unison/optim/optimizer.hpp"
#include "unison/optim/sgd.hpp"
