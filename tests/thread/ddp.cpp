// The DDP suite (tests/suites/ddp.hpp) on the thread backend, at 1 to 4 ranks.

#include "../suites/ddp.hpp"

UNISON_DDP_SUITE(unison::test::backend::thread);
