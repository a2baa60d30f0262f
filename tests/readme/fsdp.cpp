// The README's sharding program, extracted from README.md at configure time (the
// block after `<!-- test: readme_fsdp -->`, main renamed `void readme_main`): it
// must compile as written, run, and train exactly like one process on the whole
// batch (clipped to the same global norm) -- with no zero_grad in it, since step()
// zeroes.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "readme_fsdp.cpp"

#include "reference.hpp"

TEST_CASE("README: the sharding program runs as written") {
    readme_main(); // throws on any error
}

TEST_CASE("README: the sharding loop trains like one process on the whole batch, at 1-4 ranks") {
    readme_test::check_against_reference([](auto& comm, auto& model, const auto& data,
                                            std::size_t batch,
                                            int steps) { train(comm, model, data, batch, steps); },
                                         1.0, false);
}
