// expect: gradients_in_buckets keeps the gradients in bucket memory
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
bucketed_reducer<thread_communicator, policy::gradients_in_buckets,
                 policy::mixed_precision<dtype::f32, dtype::bf16>>* r = nullptr;
auto n = r->gradient_count();
