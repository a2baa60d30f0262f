// expect: more_than_one_policy_of<unison::policy::kind::optimizer
#include <unison/sharded.hpp>
#include <unison/thread.hpp>

using namespace unison;
using bad = fsdp<thread_communicator, optim::sgd, policy::shard::full, optim::adamw>;
bad::options_type options;
