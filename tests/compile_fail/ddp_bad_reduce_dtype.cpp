// expect: dtypes are f64, f32, f16 or bf16
#include <unison/ddp.hpp>
#include <unison/thread.hpp>

using namespace unison;
bucketed_reducer<thread_communicator, policy::mixed_precision<dtype::f32, dtype::i32>>* r = nullptr;
auto n = r->gradient_count();
