// Every header a host program includes, compiled (to code, so that every target
// attribute is checked) by a compiler other than the one that builds the tests:
// the `other_compiler` CTest, Clang where GCC builds them. A header-only library
// is compiled by its users' compilers, and each knows a different set of
// builtins and target features: Clang 14, for one, refused
// __builtin_cpu_supports("f16c"), so no program that included unison built with
// it. main() calls the host reduction of each floating type, so that its run-time
// dispatched loops are compiled too (the test compiles; it does not run).

#include <unison/unison.hpp>

#include <cstdio>

namespace {

template <class T>
bool reduces(unison::dtype type) {
    T a[40], b[40], out[40];
    for (int i = 0; i < 40; ++i) {
        a[i] = T(static_cast<float>(i));
        b[i] = T(static_cast<float>(2 * i));
    }
    const void* inputs[2] = {a, b};
    void* outputs[1] = {out};
    unison::detail::host_reduce(type, unison::reduce_op::sum, inputs, 2, outputs, 1, 40, 1);
    return static_cast<float>(out[39]) == 117.0f;
}

} // namespace

int main() {
    const bool ok = reduces<float>(unison::dtype::f32) && reduces<double>(unison::dtype::f64) &&
                    reduces<unison::half>(unison::dtype::f16) &&
                    reduces<unison::bf16>(unison::dtype::bf16);
    std::puts(ok ? "ok" : "wrong sums");
    return ok ? 0 : 1;
}
