// Every header a host program includes, for a compiler other than the one that
// builds the tests (the `other_compiler` CTest: Clang where GCC builds them). A
// header-only library is compiled by its users' compilers, and each knows a
// different set of builtins: Clang 14, for one, refused
// __builtin_cpu_supports("f16c"), so no program that included unison built with it.

#include <unison/unison.hpp>

#if defined(UNISON_WITH_MPI)
#include <unison/mpi.hpp>
#endif

int main() {
    return 0;
}
