// The LibTorch suite (tests/suites/torch.hpp) on the thread backend, at 1 to 4 ranks.

#include "../suites/torch.hpp"

UNISON_TORCH_SUITE(unison::test::backend::thread);
