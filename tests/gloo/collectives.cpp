// The collective suite (tests/suites/collectives.hpp) on the Gloo backend, at 1 to 4
// ranks, each a thread with its own store connection and TCP transport.

#include "../suites/collectives.hpp"

UNISON_COLLECTIVE_SUITE(unison::test::backend::gloo);
