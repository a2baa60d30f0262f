#pragma once

/// \file
/// The clock every bounded wait in unison measures its deadline on.

#include <chrono>

namespace unison::detail {

/// Monotonic: a deadline never moves when the wall clock is adjusted.
using clock = std::chrono::steady_clock;

} // namespace unison::detail
