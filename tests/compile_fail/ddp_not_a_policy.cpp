// expect: must be a DDP policy from unison::policy
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
bucketed_reducer<thread_communicator, policy::sum_only, int>* r = nullptr;
auto n = r->gradient_count();
