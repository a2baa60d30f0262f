// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the thread backend, at
// 1 to 4 ranks: training, against DDP and single-process training.

#include "../suites/sharded.hpp"

UNISON_SHARDED_TRAINING_SUITE(unison::test::backend::thread);
