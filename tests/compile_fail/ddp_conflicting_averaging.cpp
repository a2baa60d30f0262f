// expect: conflicting averaging policies
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
bucketed_reducer<thread_communicator, policy::divide_after, policy::sum_only>* r = nullptr;
auto n = r->gradient_count();
