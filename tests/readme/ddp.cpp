// The README's DDP program, extracted from README.md at configure time (the block
// after `<!-- test: readme_ddp -->`, main renamed `void readme_main`): it must
// compile as written, run, and train exactly like one process on the whole batch.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "readme_ddp.cpp"

#include "reference.hpp"

TEST_CASE("README: the DDP program runs as written") {
    readme_main(); // throws on any error
}

TEST_CASE("README: the DDP loop trains like one process on the whole batch, at 1-4 ranks") {
    // Each rank starts elsewhere: the loop's start() gives them rank 0's model.
    readme_test::check_against_reference([](auto& comm, auto& model, const auto& data,
                                            std::size_t batch,
                                            int steps) { train(comm, model, data, batch, steps); },
                                         0.0, true);
}
