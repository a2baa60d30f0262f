// expect: more_than_one_policy_of<unison::policy::kind::precision
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
ddp<thread_communicator, policy::mixed_precision<dtype::f32, dtype::bf16>,
    policy::mixed_precision<dtype::f32, dtype::f16>>* d = nullptr;
auto& r = d->reducer();
