#pragma once

/// \file
/// The communicator contract, the collective functions and launcher discovery.

#include "unison/comm/collective.hpp"
#include "unison/comm/collectives.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/comm/counting_communicator.hpp"
#include "unison/comm/launcher.hpp"
#include "unison/comm/options.hpp"
#include "unison/comm/stepped_communicator.hpp"
#include "unison/core.hpp"
