#pragma once

/// \file
/// The thread backend: `thread_world`, `thread_communicator` and its tuning.

#include "unison/comm.hpp"
#include "unison/thread/thread_communicator.hpp"
#include "unison/thread/thread_world.hpp"
#include "unison/thread/tuning.hpp"
