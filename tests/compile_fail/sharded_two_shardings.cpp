// expect: more than one sharding given
#include <unison/sharded.hpp>
#include <unison/thread.hpp>

using namespace unison;
using bad =
    sharded_parameters<thread_communicator, policy::zero<2>, policy::fsdp<policy::shard::full>>;
int stage = bad::stage;
