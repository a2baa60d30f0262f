// expect: reshard_after_forward<true> needs sharded parameters
#include <unison/sharded.hpp>
#include <unison/thread.hpp>

using namespace unison;
using bad =
    sharded_parameters<thread_communicator, policy::zero<1>, policy::reshard_after_forward<true>>;
int stage = bad::stage;
