// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the Gloo backend, at
// 1 to 4 ranks.

#include "../suites/sharded.hpp"

UNISON_SHARDED_SUITE(unison::test::backend::gloo);
