// The README's DDP program, extracted from README.md at configure time (the block
// after `<!-- test: readme_ddp -->`, main renamed `void readme_main`): it must compile as
// written, run, and train exactly like one process on the whole batch.

#include "readme_ddp.cpp"

#include "reference.hpp"

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>

TEST_CASE("README: the DDP program runs as written") {
    readme_main(); // throws on any error
}

TEST_CASE("README: the DDP loop trains like one process on the whole batch, at 1-4 ranks") {
    const auto data = readme_test::data();
    nn::mlp<float> reference(readme_test::widths, 7);
    readme_test::train_reference(reference, data, 0.0);
    for (int ranks = 1; ranks <= 4; ++ranks) {
        CAPTURE(ranks);
        unison::thread_world(ranks).run([&](unison::thread_communicator& comm) {
            // Each rank starts elsewhere: the loop's start() gives them rank 0's model.
            nn::mlp<float> model(readme_test::widths, 7 + static_cast<std::uint64_t>(comm.rank()));
            train(comm, model, data, readme_test::batch, readme_test::steps);
            const auto got = model.parameters();
            const auto want = reference.parameters();
            for (std::size_t p = 0; p < got.size(); ++p) {
                const double err =
                    readme_test::relative_error(got[p]->own_value, want[p]->own_value);
                CHECK_MESSAGE(err <= 1e-5, "rank " << comm.rank() << " " << got[p]->name
                                                   << " relative error " << err);
            }
        });
    }
}
