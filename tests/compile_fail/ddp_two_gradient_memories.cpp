// expect: more_than_one_policy_of<unison::policy::kind::gradient_memory, unison::detail::type_list<unison::policy::gradients_in_buckets, unison::policy::gradients_separate
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
bucketed_reducer<thread_communicator, policy::gradients_in_buckets, policy::unused_is_error,
                 policy::gradients_separate>* r = nullptr;
auto n = r->gradient_count();
