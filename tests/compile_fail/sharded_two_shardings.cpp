// expect: more_than_one_policy_of<unison::policy::kind::sharding, unison::detail::type_list<unison::policy::shard::gradients, unison::policy::shard::full
#include <unison/sharded.hpp>
#include <unison/thread.hpp>

using namespace unison;
using bad = sharded_parameters<thread_communicator, policy::zero<2>, policy::shard::full>;
int stage = bad::stage;
