// expect: gradients live in buckets only with policy::gradients_in_buckets
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
void f(bucketed_reducer<thread_communicator>& r) {
    (void)r.gradient<float>(0);
}
