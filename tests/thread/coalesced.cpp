// The coalesced all-reduce suite (tests/suites/coalesced.hpp) on the thread backend,
// at 1 to 4 ranks.

#include "../suites/coalesced.hpp"

UNISON_COALESCED_SUITE(unison::test::backend::thread);
