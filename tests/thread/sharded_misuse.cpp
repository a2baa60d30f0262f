// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the thread backend, at
// 1 to 4 ranks: misuse, and a rank that skips a step.

#include "../suites/sharded.hpp"

UNISON_SHARDED_MISUSE_SUITE(unison::test::backend::thread);
