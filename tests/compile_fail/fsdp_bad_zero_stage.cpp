// expect: the stage is 0, 1, 2 or 3
#include <unison/sharded.hpp>
#include <unison/thread.hpp>

using namespace unison;
using bad = fsdp<thread_communicator, policy::zero<4>>;
bad::options_type options;
