// The tensor contract: the shipped adapters, the concepts' answers, and a user type
// with its own tensor_traits going through all_reduce on the thread backend.

#include "unison/core/tensor.hpp"
#include "unison/thread.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

namespace {

using unison::device;
using unison::dtype;

// ---------------------------------------------------------- concept answers

static_assert(unison::writable_tensor<std::vector<double>&>);
static_assert(unison::writable_tensor<std::vector<std::int8_t>>);
static_assert(unison::tensor<const std::vector<float>&> &&
              !unison::writable_tensor<const std::vector<float>&>);
static_assert(unison::writable_tensor<std::array<std::int32_t, 3>&> &&
              !unison::writable_tensor<const std::array<std::int32_t, 3>&>);
static_assert(unison::writable_tensor<std::span<unison::half>> &&
              unison::writable_tensor<std::span<float, 4>>);
static_assert(unison::tensor<std::span<const float>> &&
              !unison::writable_tensor<std::span<const float>>);
static_assert(unison::writable_tensor<unison::view<std::uint8_t>> &&
              unison::tensor<unison::view<const std::uint8_t>> &&
              !unison::writable_tensor<unison::view<const std::uint8_t>>);
static_assert(unison::writable_tensor<unison::buffer> && unison::tensor<unison::const_buffer> &&
              !unison::writable_tensor<unison::const_buffer>);
static_assert(unison::writable_tensor<std::vector<std::uint32_t>&> &&
              unison::writable_tensor<std::vector<std::uint64_t>&>);

// Not tensors: no element type, not contiguous, not a container.
static_assert(!unison::tensor<std::vector<bool>>);
static_assert(!unison::tensor<std::vector<std::uint16_t>>);
static_assert(!unison::tensor<std::list<float>>);
static_assert(!unison::tensor<float>);
static_assert(!unison::tensor<float*>);

// ------------------------------------------------------------ a user tensor

/// A tensor whose dtype is chosen at run time, as in a framework's own tensor
/// class: raw storage plus a dtype tag.
struct dynamic_tensor {
    std::vector<std::byte> storage;
    std::size_t count = 0;
    dtype type = dtype::u8;

    dynamic_tensor(std::size_t n, dtype t) : storage(n * unison::size_of(t)), count(n), type(t) {}

    template <class T>
    T get(std::size_t i) const {
        T v;
        std::memcpy(&v, storage.data() + i * sizeof(T), sizeof(T));
        return v;
    }
    template <class T>
    void set(std::size_t i, T v) {
        std::memcpy(storage.data() + i * sizeof(T), &v, sizeof(T));
    }
};

} // namespace

template <>
struct unison::tensor_traits<dynamic_tensor> {
    static void* data(dynamic_tensor& t) noexcept { return t.storage.data(); }
    static const void* data(const dynamic_tensor& t) noexcept { return t.storage.data(); }
    static std::size_t size(const dynamic_tensor& t) noexcept { return t.count; }
    static dtype type(const dynamic_tensor& t) noexcept { return t.type; }
    static device location(const dynamic_tensor&) noexcept { return device::host(); }
};

static_assert(unison::writable_tensor<dynamic_tensor&>);
static_assert(unison::tensor<const dynamic_tensor&> &&
              !unison::writable_tensor<const dynamic_tensor&>);

namespace {

/// Rank `rank`'s input: `count` random values of type `T`, never all zero (any
/// value of an unsigned type, so that sums wrap).
template <class T>
dynamic_tensor random_input(int rank, std::size_t count) {
    std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(rank));
    dynamic_tensor t(count, unison::dtype_of<T>);
    for (std::size_t i = 0; i < count; ++i) {
        if constexpr (std::is_floating_point_v<T>) {
            t.set<T>(i, static_cast<T>(std::uniform_real_distribution<double>(-4.0, 4.0)(rng)));
        } else if constexpr (std::is_unsigned_v<T>) {
            t.set<T>(i, static_cast<T>(rng()));
        } else {
            t.set<T>(i, static_cast<T>(std::uniform_int_distribution<int>(-1000, 1000)(rng)));
        }
    }
    return t;
}

/// all_reduce (sum, out of place and in place) of a dynamic_tensor of element type
/// `T` over 3 thread ranks, checked element by element against a serial sum in
/// double of the three ranks' inputs (in `T` itself for the unsigned types, exact
/// and wrapping). `tolerance` is relative to the sum of magnitudes, 0 for exact.
template <class T>
void check_dynamic_all_reduce(double tolerance) {
    constexpr int ranks = 3;
    constexpr std::size_t count = 5003; // not a multiple of the ranks or of a cache line
    std::vector<double> sum(count, 0.0), magnitude(count, 0.0);
    std::vector<T> wrapped(count, T{});
    for (int r = 0; r < ranks; ++r) {
        const dynamic_tensor in = random_input<T>(r, count);
        for (std::size_t i = 0; i < count; ++i) {
            sum[i] += static_cast<double>(in.get<T>(i));
            magnitude[i] += std::fabs(static_cast<double>(in.get<T>(i)));
            wrapped[i] = static_cast<T>(wrapped[i] + in.get<T>(i));
        }
    }
    std::vector<dynamic_tensor> out_of_place(ranks, dynamic_tensor(0, unison::dtype_of<T>));
    std::vector<dynamic_tensor> in_place(ranks, dynamic_tensor(0, unison::dtype_of<T>));
    unison::thread_world(ranks).run([&](unison::thread_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        const dynamic_tensor in = random_input<T>(comm.rank(), count);
        dynamic_tensor out(count, unison::dtype_of<T>);
        unison::all_reduce(comm, in, out);
        out_of_place[r] = std::move(out);
        dynamic_tensor inout = random_input<T>(comm.rank(), count);
        unison::all_reduce(comm, inout);
        in_place[r] = std::move(inout);
    });
    for (int r = 0; r < ranks; ++r) {
        const dynamic_tensor* results[] = {&out_of_place[static_cast<std::size_t>(r)],
                                           &in_place[static_cast<std::size_t>(r)]};
        for (const dynamic_tensor* result : results) {
            REQUIRE(result->count == count);
            REQUIRE(result->type == unison::dtype_of<T>);
            std::size_t wrong = 0;
            std::size_t first = count;
            for (std::size_t i = 0; i < count; ++i) {
                const double got = static_cast<double>(result->get<T>(i));
                const bool ok = std::is_unsigned_v<T>
                                    ? result->get<T>(i) == wrapped[i]
                                    : std::fabs(got - sum[i]) <= tolerance * magnitude[i];
                if (!ok) {
                    first = wrong++ == 0 ? i : first;
                }
            }
            INFO("rank ", r, (result == &in_place[static_cast<std::size_t>(r)] ? " in place" : ""),
                 ": first wrong element ", first);
            CHECK(wrong == 0);
        }
    }
}

} // namespace

// ------------------------------------------------------------------ adapters

TEST_CASE("tensor: std::vector is a host tensor of its element type") {
    std::vector<float> v{1.5f, -2.0f, 3.25f, 4.0f, 5.0f};
    CHECK(unison::tensor_data(v) == v.data());
    CHECK(unison::tensor_size(v) == 5);
    CHECK(unison::tensor_dtype(v) == dtype::f32);
    CHECK(unison::tensor_device(v) == device::host());

    const std::vector<std::int64_t> c{7, 8, 9};
    const void* p = unison::tensor_data(c); // read-only access to a const container
    CHECK(p == c.data());
    CHECK(unison::tensor_size(c) == 3);
    CHECK(unison::tensor_dtype(c) == dtype::i64);

    std::vector<unison::bf16> empty;
    CHECK(unison::tensor_size(empty) == 0);
    CHECK(unison::tensor_dtype(empty) == dtype::bf16);
}

TEST_CASE("tensor: std::array and std::span") {
    std::array<std::int32_t, 3> a{1, 2, 3};
    CHECK(unison::tensor_data(a) == a.data());
    CHECK(unison::tensor_size(a) == 3);
    CHECK(unison::tensor_dtype(a) == dtype::i32);
    CHECK(unison::tensor_device(a).is_host());

    std::vector<double> storage{1.0, 2.0, 3.0, 4.0, 5.0, 6.0};
    std::span<double> s(storage.data() + 2, 3);
    CHECK(unison::tensor_data(s) == storage.data() + 2);
    CHECK(unison::tensor_size(s) == 3);
    CHECK(unison::tensor_dtype(s) == dtype::f64);

    std::span<const double, 4> fixed(storage.data(), 4);
    CHECK(unison::tensor_data(fixed) == storage.data());
    CHECK(unison::tensor_size(fixed) == 4);
    CHECK(unison::tensor_dtype(fixed) == dtype::f64);

    std::array<unison::half, 2> h{};
    CHECK(unison::tensor_dtype(h) == dtype::f16);
    CHECK(unison::tensor_size(h) == 2);
}

TEST_CASE("tensor: view carries its device") {
    std::vector<std::uint8_t> bytes(16, 1);
    unison::view<std::uint8_t> host_view{bytes.data(), bytes.size()};
    CHECK(unison::tensor_data(host_view) == bytes.data());
    CHECK(unison::tensor_size(host_view) == 16);
    CHECK(unison::tensor_dtype(host_view) == dtype::u8);
    CHECK(unison::tensor_device(host_view) == device::host());

    // A device pointer is never dereferenced by the adapter; any address will do.
    float* fake_device_pointer = reinterpret_cast<float*>(std::uintptr_t{0x1000});
    unison::view<const float> cuda_view{fake_device_pointer, 100, device::cuda(1)};
    CHECK(unison::tensor_data(cuda_view) == fake_device_pointer);
    CHECK(unison::tensor_device(cuda_view) == device::cuda(1));
    CHECK(unison::tensor_device(cuda_view).is_cuda());
    CHECK(unison::tensor_device(cuda_view).index == 1);
    CHECK(unison::tensor_dtype(cuda_view) == dtype::f32);
}

TEST_CASE("tensor: buffer and const_buffer describe untyped memory") {
    std::vector<unison::bf16> storage(10);
    unison::buffer b{storage.data(), storage.size(), dtype::bf16, device::host()};
    CHECK(unison::tensor_data(b) == storage.data());
    CHECK(unison::tensor_size(b) == 10);
    CHECK(unison::tensor_dtype(b) == dtype::bf16);
    CHECK(unison::tensor_device(b).is_host());

    const unison::const_buffer c = b; // a writable buffer is readable
    CHECK(c.data == storage.data());
    CHECK(c.count == 10);
    CHECK(c.type == dtype::bf16);
    CHECK(c.location == device::host());

    const unison::const_buffer d(storage.data(), 4, dtype::i8, device::cuda(2));
    CHECK(unison::tensor_size(d) == 4);
    CHECK(unison::tensor_dtype(d) == dtype::i8);
    CHECK(unison::tensor_device(d) == device::cuda(2));
}

TEST_CASE("tensor: as_buffer and as_const_buffer keep every field") {
    std::vector<std::int32_t> v(7, 3);
    const unison::buffer b = unison::as_buffer(v);
    CHECK(b.data == v.data());
    CHECK(b.count == 7);
    CHECK(b.type == dtype::i32);
    CHECK(b.location == device::host());

    const unison::const_buffer c = unison::as_const_buffer(std::as_const(v));
    CHECK(c.data == v.data());
    CHECK(c.count == 7);
    CHECK(c.type == dtype::i32);

    unison::view<double> cuda_view{reinterpret_cast<double*>(std::uintptr_t{0x2000}), 5,
                                   device::cuda(3)};
    const unison::buffer d = unison::as_buffer(cuda_view);
    CHECK(d.type == dtype::f64);
    CHECK(d.location == device::cuda(3));
}

TEST_CASE("tensor: device names") {
    CHECK(unison::to_string(device::host()) == "host");
    CHECK(unison::to_string(device::cuda(0)) == "cuda:0");
    CHECK(unison::to_string(device::cuda(7)) == "cuda:7");
    CHECK(device::host() != device::cuda(0));
    CHECK(device::cuda(0) != device::cuda(1));
    CHECK(device{} == device::host());
}

TEST_CASE("tensor: a user type with its own tensor_traits") {
    dynamic_tensor t(6, dtype::i64);
    CHECK(unison::tensor_data(t) == t.storage.data());
    CHECK(unison::tensor_size(t) == 6);
    CHECK(unison::tensor_dtype(t) == dtype::i64);
    const unison::buffer b = unison::as_buffer(t);
    CHECK(b.count == 6);
    CHECK(b.type == dtype::i64);
}

TEST_CASE("tensor: all_reduce of a user tensor type over 3 thread ranks") {
    SUBCASE("double") {
        check_dynamic_all_reduce<double>(1e-15);
    }
    SUBCASE("float") {
        check_dynamic_all_reduce<float>(4 * 6e-8);
    }
    SUBCASE("int32") {
        check_dynamic_all_reduce<std::int32_t>(0);
    }
    SUBCASE("int64") {
        check_dynamic_all_reduce<std::int64_t>(0);
    }
    SUBCASE("uint32") {
        check_dynamic_all_reduce<std::uint32_t>(0);
    }
    SUBCASE("uint64") {
        check_dynamic_all_reduce<std::uint64_t>(0);
    }
}
