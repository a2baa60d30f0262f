// expect: more than one bucket_size given
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
ddp<thread_communicator, policy::bucket_size<1024>, policy::reduce_dtype<dtype::bf16>,
    policy::bucket_size<2048>>* d = nullptr;
auto& r = d->reducer();
