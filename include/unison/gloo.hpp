#pragma once

/// \file
/// The Gloo backend: `gloo_communicator`, over Gloo's TCP transport, its ranks met
/// through `tcp_store`. Link `unison::gloo`.

#include "unison/comm.hpp"
#include "unison/gloo/gloo_communicator.hpp"
#include "unison/rendezvous.hpp"
