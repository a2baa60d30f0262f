// expect: master weights are f32 or f64
#include <unison/sharded.hpp>

using namespace unison;
using bad = policy::mixed_precision<dtype::bf16, dtype::bf16, dtype::f16>;
bool b = bad::master == dtype::f16;
