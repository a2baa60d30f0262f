// expect: not_a_policy_of<unison::detail::sharded_engine, unison::policy::gradients_in_buckets>
#include <unison/ddp.hpp>
#include <unison/sharded.hpp>
#include <unison/thread.hpp>

using namespace unison;
using bad = sharded_parameters<thread_communicator, policy::zero<1>, policy::gradients_in_buckets>;
int stage = bad::stage;
