#pragma once

/// \file
/// Meeting without MPI: the TCP store on MASTER_ADDR (torchrun's and Kubernetes'
/// conventions), its server, and the local rank from the rendezvous.

#include "unison/rendezvous/launch.hpp"
#include "unison/rendezvous/store_server.hpp"
#include "unison/rendezvous/tcp_store.hpp"
