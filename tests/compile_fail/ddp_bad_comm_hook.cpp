// expect: the comm_hook's type needs `request_type launch
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
struct not_a_hook {
    void launch() {}
};
bucketed_reducer<thread_communicator, policy::comm_hook<not_a_hook>>* r = nullptr;
auto n = r->gradient_count();
