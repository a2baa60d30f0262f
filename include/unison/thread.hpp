#pragma once

/// \file
/// The thread backend: `thread_world` and `thread_communicator`.

#include "unison/comm.hpp"
#include "unison/thread/thread_communicator.hpp"
#include "unison/thread/thread_world.hpp"
