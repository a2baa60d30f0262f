// expect: not_a_policy_of<unison::detail::ddp_engine, int>
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
bucketed_reducer<thread_communicator, policy::unused_is_error, int>* r = nullptr;
auto n = r->gradient_count();
