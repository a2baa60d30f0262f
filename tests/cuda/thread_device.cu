// The thread backend on device memory (unison/thread/device.cuh): N ranks as
// threads sharing one GPU, each on its own stream, collectives as kernels reading
// the peers' buffers. Results are checked against the serial double-precision
// reference of tests/support/reference.hpp. The collective and DDP suites run on
// this backend too (collectives.cu, ddp.cu); these are the cases beyond them.

#include "../collectives/cases.hpp"
#include "backends.hpp"
#include "support.cuh"

#include <unison/comm.hpp>
#include <unison/parallel/device.cuh>
#include <unison/thread.hpp>
#include <unison/thread/device.cuh>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace unison;

// The collective suite runs on the thread backend on a GPU at 1 to 4 ranks
// (collectives.cu); this is a larger world of the reduction kernels.
TEST_CASE("thread backend on device: all_reduce at 8 ranks, in place and out of place") {
    thread_world(8).run([](thread_communicator& comm) {
        cuda::use_device(comm, 0);
        const int n = comm.size();
        for (dtype t : {dtype::f32, dtype::bf16, dtype::f16, dtype::f64, dtype::i32, dtype::u64}) {
            for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::prod}) {
                if (op == reduce_op::avg && !is_floating(t)) {
                    continue;
                }
                for (std::size_t count : test::test_counts(t)) {
                    for (bool in_place : {true, false}) {
                        auto in = test::device_space::make(
                            comm, test::filled(t, count, op, 17, comm.rank()));
                        auto out = test::device_space::make(comm, test::host_buffer(t, count));
                        if (in_place) {
                            all_reduce(comm, in.view(), op);
                        } else {
                            all_reduce(comm, in.view(), out.view(), op);
                        }
                        const test::host_buffer got =
                            test::device_space::read(comm, in_place ? in : out);
                        std::string why;
                        for (std::size_t i = 0; i < count; ++i) {
                            if (!test::same(t, got[i], test::reference(t, op, 17, n, i), n, &why,
                                            i)) {
                                break;
                            }
                        }
                        CHECK_MESSAGE(why.empty(),
                                      test::case_name("all_reduce", t, op, count, in_place)
                                          << ": " << why);
                    }
                }
            }
        }
    });
}

TEST_CASE("thread backend on device: misuse is named before any data moves") {
    // No device attached.
    CHECK_THROWS_WITH_AS(thread_world(2).run([](thread_communicator& comm) {
        cuda::device_buffer<float> g(8, 0);
        all_reduce(comm, g);
    }),
                         doctest::Contains("no device is attached"), argument_error);
    // One rank passes host memory, the others device memory.
    CHECK_THROWS_WITH_AS(thread_world(3).run([](thread_communicator& comm) {
        cuda::use_device(comm, 0);
        cuda::device_buffer<float> g(8, 0);
        std::vector<float> h(8, 1.0f);
        if (comm.rank() == 1) {
            all_reduce(comm, h);
        } else {
            all_reduce(comm, g);
        }
    }),
                         doctest::Contains("passes data on"), mismatch_error);
}
