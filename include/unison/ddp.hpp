#pragma once

/// \file
/// Data parallelism: policies, hooks, `bucketed_reducer`, `ddp`, `join` and loss
/// normalization.

#include "unison/comm.hpp"
#include "unison/ddp/bucketed_reducer.hpp"
#include "unison/ddp/ddp.hpp"
#include "unison/ddp/hooks.hpp"
#include "unison/ddp/join.hpp"
#include "unison/ddp/loss.hpp"
#include "unison/ddp/options.hpp"
#include "unison/ddp/policies.hpp"
