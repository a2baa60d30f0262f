// Checkpoints of an older format version still load: tests/data/checkpoint-v1 was
// written by format version 1 (FNV-1a checksums; see tests/data/README.md). Read
// as it is, then loaded at 1 to 3 ranks and saved again in the current version, it
// must give back exactly the values it was written with.

#include "../sharded/checkpoint.hpp"

#include <unison/thread.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace unison;
using namespace unison::policy;

const fs::path v1_dir = fs::path(UNISON_TEST_DATA_DIR) / "checkpoint-v1";

} // namespace

TEST_CASE("thread: a checkpoint of format version 1 still loads, bit for bit") {
    checkpoint::reader v1(v1_dir);
    CHECK(v1.meta().version == 1);
    const std::vector<std::string> names = {"layer0.w", "layer0.b", "layer1.w"};
    const std::vector<std::size_t> sizes = {37, 5, 64};
    for (std::size_t id = 0; id < names.size(); ++id) {
        std::vector<double> got(sizes[id]);
        v1.read(names[id], "param", 0, got.size(), got.data(), dtype::f64);
        for (std::size_t i = 0; i < got.size(); ++i) {
            CHECK(got[i] == static_cast<double>(id * 1000 + i) * 0.125 - 20.0);
        }
    }
    const auto want = test::checkpoint_contents(v1_dir);
    for (int ranks = 1; ranks <= 3; ++ranks) {
        CAPTURE(ranks);
        thread_world(ranks).run([&](thread_communicator& comm) {
            using sp_type = sharded_parameters<thread_communicator, zero<3>>;
            sp_type sp(comm);
            sp.add_unit({{"layer0.w", 37}, {"layer0.b", 5}});
            sp.add_unit({{"layer1.w", 64}});
            sp.start();
            partitioned_optimizer<sp_type, optim::adamw> opt(sp, optim::adamw{});
            load_checkpoint(v1_dir, sp, opt);
            test::shared_temp_dir<thread_communicator> tmp(comm, "v2");
            save_checkpoint(tmp.path(), sp, opt);
            if (comm.rank() == 0) {
                CHECK(checkpoint::reader(tmp.path()).meta().version == checkpoint::format_version);
                CHECK(test::checkpoint_contents(tmp.path()) == want);
            }
            barrier(comm); // rank 0 reads before the directory goes
        });
    }
}
