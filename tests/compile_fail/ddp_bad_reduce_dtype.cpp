// expect: reduce in a floating-point dtype
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
bucketed_reducer<thread_communicator, policy::reduce_dtype<dtype::i32>>* r = nullptr;
auto n = r->gradient_count();
