#pragma once

/// \file
/// dtypes, 16-bit float types, the tensor contract, reduce ops and errors.

#include "unison/core/config.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"
#include "unison/core/half.hpp"
#include "unison/core/log.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/core/tensor.hpp"
#include "unison/core/timeline.hpp"
