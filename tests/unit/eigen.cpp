// The Eigen adapter (unison/core/eigen.hpp): traits of dense matrices, arrays and
// contiguous maps, and all_reduce of Eigen objects over 2 thread ranks against a
// serial sum in double. CMake compiles this file only when Eigen was found.

#include "unison/core/eigen.hpp"
#include "unison/thread.hpp"

#include <doctest/doctest.h>

#include <Eigen/Core>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

using unison::dtype;

// Which Eigen types are tensors, and which are writable.
static_assert(unison::writable_tensor<Eigen::VectorXd&>);
static_assert(unison::writable_tensor<Eigen::MatrixXf&>);
static_assert(unison::writable_tensor<Eigen::Matrix<float, 3, 4>&>);
static_assert(unison::writable_tensor<
              Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>&>);
static_assert(unison::writable_tensor<Eigen::Array<std::int32_t, Eigen::Dynamic, 1>&>);
static_assert(unison::writable_tensor<Eigen::Array<std::int64_t, 2, 2>&>);
static_assert(unison::tensor<const Eigen::MatrixXd&> &&
              !unison::writable_tensor<const Eigen::MatrixXd&>);
static_assert(unison::writable_tensor<Eigen::Map<Eigen::MatrixXf>>);
static_assert(unison::writable_tensor<Eigen::Map<Eigen::VectorXd, Eigen::Aligned16>>);
static_assert(unison::tensor<Eigen::Map<const Eigen::VectorXd>> &&
              !unison::writable_tensor<Eigen::Map<const Eigen::VectorXd>>);
// A vector map with an explicit unit inner stride is contiguous too.
static_assert(unison::writable_tensor<Eigen::Map<Eigen::VectorXf, 0, Eigen::InnerStride<1>>>);
// Scalars unison cannot reduce are not tensors.
static_assert(!unison::tensor<Eigen::VectorXcd>);
static_assert(!unison::tensor<Eigen::Matrix<std::uint16_t, 2, 2>>);
static_assert(!unison::tensor<Eigen::Map<Eigen::Matrix<long double, 2, 1>>>);

/// `rows` x `cols` random values in [-4, 4) from a seed per rank.
template <class M>
M random_matrix(int rank, Eigen::Index rows, Eigen::Index cols) {
    std::mt19937_64 rng(77 + static_cast<std::uint64_t>(rank));
    std::uniform_real_distribution<double> dist(-4.0, 4.0);
    M m(rows, cols);
    for (Eigen::Index j = 0; j < m.cols(); ++j) {
        for (Eigen::Index i = 0; i < m.rows(); ++i) {
            m(i, j) = static_cast<typename M::Scalar>(dist(rng));
        }
    }
    return m;
}

/// Checks `got` against the double reference `want`: every coefficient within
/// `tolerance` times the sum of the inputs' magnitudes `magnitude`.
template <class M>
void check_close(const M& got, const Eigen::MatrixXd& want, const Eigen::MatrixXd& magnitude,
                 double tolerance) {
    REQUIRE(got.rows() == want.rows());
    REQUIRE(got.cols() == want.cols());
    const Eigen::MatrixXd error = (got.template cast<double>() - want).cwiseAbs();
    const Eigen::MatrixXd bound = tolerance * magnitude;
    Eigen::Index wrong = 0;
    for (Eigen::Index j = 0; j < want.cols(); ++j) {
        for (Eigen::Index i = 0; i < want.rows(); ++i) {
            wrong += error(i, j) > bound(i, j) ? 1 : 0;
        }
    }
    INFO("largest error ", error.maxCoeff());
    CHECK(wrong == 0);
}

constexpr int ranks = 2;

} // namespace

TEST_CASE("eigen: traits of matrices, arrays and maps") {
    Eigen::MatrixXf m(3, 5);
    CHECK(unison::tensor_data(m) == m.data());
    CHECK(unison::tensor_size(m) == 15);
    CHECK(unison::tensor_dtype(m) == dtype::f32);
    CHECK(unison::tensor_device(m) == unison::device::host());

    Eigen::Matrix<std::int32_t, 2, 4, Eigen::RowMajor> fixed;
    CHECK(unison::tensor_data(fixed) == fixed.data());
    CHECK(unison::tensor_size(fixed) == 8);
    CHECK(unison::tensor_dtype(fixed) == dtype::i32);

    Eigen::ArrayXXd a(4, 2);
    CHECK(unison::tensor_size(a) == 8);
    CHECK(unison::tensor_dtype(a) == dtype::f64);

    std::vector<std::int64_t> storage(12, 5);
    Eigen::Map<Eigen::Matrix<std::int64_t, Eigen::Dynamic, Eigen::Dynamic>> map(storage.data(), 3,
                                                                                4);
    CHECK(unison::tensor_data(map) == storage.data());
    CHECK(unison::tensor_size(map) == 12);
    CHECK(unison::tensor_dtype(map) == dtype::i64);

    const Eigen::Map<const Eigen::VectorXd> read_only(nullptr, 0);
    CHECK(unison::tensor_size(read_only) == 0);

    Eigen::VectorXd empty;
    CHECK(unison::tensor_size(empty) == 0);
}

TEST_CASE("eigen: all_reduce of VectorXd over 2 thread ranks") {
    const Eigen::Index n = 1001;
    Eigen::MatrixXd sum = Eigen::MatrixXd::Zero(n, 1);
    Eigen::MatrixXd magnitude = Eigen::MatrixXd::Zero(n, 1);
    for (int r = 0; r < ranks; ++r) {
        const Eigen::VectorXd in = random_matrix<Eigen::VectorXd>(r, n, 1);
        sum += in;
        magnitude += in.cwiseAbs();
    }
    std::vector<Eigen::VectorXd> out_of_place(ranks), in_place(ranks);
    unison::thread_world(ranks).run([&](unison::thread_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        const Eigen::VectorXd in = random_matrix<Eigen::VectorXd>(comm.rank(), n, 1);
        out_of_place[r].resize(n);
        unison::all_reduce(comm, in, out_of_place[r]);
        in_place[r] = in;
        unison::all_reduce(comm, in_place[r]);
    });
    for (int r = 0; r < ranks; ++r) {
        INFO("rank ", r);
        check_close(out_of_place[static_cast<std::size_t>(r)], sum, magnitude, 1e-15);
        check_close(in_place[static_cast<std::size_t>(r)], sum, magnitude, 1e-15);
    }
}

TEST_CASE("eigen: all_reduce of MatrixXf over 2 thread ranks") {
    const Eigen::Index rows = 37, cols = 29;
    Eigen::MatrixXd sum = Eigen::MatrixXd::Zero(rows, cols);
    Eigen::MatrixXd magnitude = Eigen::MatrixXd::Zero(rows, cols);
    for (int r = 0; r < ranks; ++r) {
        const Eigen::MatrixXd in = random_matrix<Eigen::MatrixXf>(r, rows, cols).cast<double>();
        sum += in;
        magnitude += in.cwiseAbs();
    }
    std::vector<Eigen::MatrixXf> out_of_place(ranks), in_place(ranks);
    unison::thread_world(ranks).run([&](unison::thread_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        const Eigen::MatrixXf in = random_matrix<Eigen::MatrixXf>(comm.rank(), rows, cols);
        out_of_place[r].resize(rows, cols);
        unison::all_reduce(comm, in, out_of_place[r]);
        in_place[r] = in;
        unison::all_reduce(comm, in_place[r]);
    });
    for (int r = 0; r < ranks; ++r) {
        INFO("rank ", r);
        // One float rounding of a two-term sum.
        check_close(out_of_place[static_cast<std::size_t>(r)], sum, magnitude, 6e-8);
        check_close(in_place[static_cast<std::size_t>(r)], sum, magnitude, 6e-8);
    }
}

TEST_CASE("eigen: all_reduce through a Map over a std::vector over 2 thread ranks") {
    const Eigen::Index rows = 64, cols = 33;
    using row_major = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::MatrixXd max =
        Eigen::MatrixXd::Constant(rows, cols, -std::numeric_limits<double>::infinity());
    Eigen::MatrixXd sum = Eigen::MatrixXd::Zero(rows, cols);
    Eigen::MatrixXd magnitude = Eigen::MatrixXd::Zero(rows, cols);
    for (int r = 0; r < ranks; ++r) {
        const Eigen::MatrixXd in = random_matrix<row_major>(r, rows, cols);
        sum += in;
        magnitude += in.cwiseAbs();
        max = max.cwiseMax(in);
    }
    std::vector<row_major> summed(ranks), maxed(ranks);
    unison::thread_world(ranks).run([&](unison::thread_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        const row_major in = random_matrix<row_major>(comm.rank(), rows, cols);
        std::vector<double> input(in.data(), in.data() + in.size());
        std::vector<double> output(input.size());
        // Read-only map in, writable map out; the maps are temporaries.
        unison::all_reduce(comm, Eigen::Map<const row_major>(input.data(), rows, cols),
                           Eigen::Map<row_major>(output.data(), rows, cols));
        summed[r] = Eigen::Map<row_major>(output.data(), rows, cols);
        Eigen::Map<row_major> inout(input.data(), rows, cols);
        unison::all_reduce(comm, inout, unison::reduce_op::max);
        maxed[r] = inout;
    });
    for (int r = 0; r < ranks; ++r) {
        INFO("rank ", r);
        check_close(summed[static_cast<std::size_t>(r)], sum, magnitude, 1e-15);
        check_close(maxed[static_cast<std::size_t>(r)], max, magnitude, 0.0);
    }
}
