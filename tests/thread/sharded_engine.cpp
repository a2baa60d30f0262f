// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the thread backend, at
// 1 to 4 ranks: the fsdp engine's prefetch order, unit reuse and unused units.

#include "../suites/sharded.hpp"

UNISON_SHARDED_ENGINE_SUITE(unison::test::backend::thread);
