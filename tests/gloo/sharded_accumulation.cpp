// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the Gloo backend, at 1
// to 4 ranks: gradient accumulation in every mode, against one big batch.

#include "../suites/sharded.hpp"

UNISON_SHARDED_ACCUMULATION_SUITE(unison::test::backend::gloo);
