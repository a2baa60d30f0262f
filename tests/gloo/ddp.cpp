// The DDP suite (tests/suites/ddp.hpp) on the Gloo backend, at 1 to 4 ranks.

#include "../suites/ddp.hpp"

UNISON_DDP_SUITE(unison::test::backend::gloo);
