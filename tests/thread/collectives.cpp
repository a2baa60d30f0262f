// The collective suite (tests/suites/collectives.hpp) on the thread backend, at 1 to 4 ranks.

#include "../suites/collectives.hpp"

UNISON_COLLECTIVE_SUITE(unison::test::backend::thread);
