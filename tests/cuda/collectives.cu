// The collective suite (tests/suites/collectives.hpp) on the thread backend on a GPU:
// worlds of 1 to 4 ranks sharing GPU 0, every tensor in device memory.

#include "../suites/collectives.hpp"
#include "backends.cuh"

UNISON_COLLECTIVE_SUITE(unison::test::backend::thread_on_gpu);
