// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the Gloo backend, at 1
// to 4 ranks: memory and traffic accounting, mixed precision, clipping, loss scaling
// and checkpoints.

#include "../suites/sharded.hpp"

UNISON_SHARDED_STATE_SUITE(unison::test::backend::gloo);
