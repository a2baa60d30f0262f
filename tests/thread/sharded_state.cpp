// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the thread backend, at
// 1 to 4 ranks: memory and traffic accounting, mixed precision, clipping, loss scaling
// and checkpoints; and resharding a checkpoint across world sizes, which only the
// thread backend can do within one run.

#include "../suites/sharded.hpp"

#include <filesystem>
#include <random>
#include <string>

UNISON_SHARDED_STATE_SUITE(unison::test::backend::thread);

TEST_CASE("thread sharded: ZeRO-3 at 4 ranks resumes as ZeRO-1 at 2, DDP at 1, ZeRO-2 at 3") {
    using namespace unison::policy;
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() /
                         ("unison-reshard-" + std::to_string(std::random_device{}() & 0xffffff));
    unison::thread_world(4).run([&](auto& comm) {
        unison::test::train_and_save<
            zero<3>, mixed_precision<unison::dtype::bf16, unison::dtype::bf16, unison::dtype::f32>>(
            comm, dir / "a", 3);
    });
    unison::thread_world(2).run(
        [&](auto& comm) { unison::test::load_and_resave<zero<1>>(comm, dir / "a", dir / "b"); });
    unison::thread_world(1).run(
        [&](auto& comm) { unison::test::load_and_resave<zero<0>>(comm, dir / "b", dir / "c"); });
    unison::thread_world(3).run(
        [&](auto& comm) { unison::test::load_and_resave<zero<2>>(comm, dir / "c", dir / "d"); });
    const auto ref = unison::test::checkpoint_contents(dir / "a");
    CHECK(unison::checkpoint::reader(dir / "a").meta().world_size == 4);
    CHECK(unison::checkpoint::reader(dir / "d").meta().world_size == 3);
    for (const char* d : {"b", "c", "d"}) {
        CAPTURE(d);
        CHECK(unison::test::checkpoint_contents(dir / d) == ref);
    }
    fs::remove_all(dir);
}
