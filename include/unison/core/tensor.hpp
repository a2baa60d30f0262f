#pragma once

/// \file
/// The tensor contract. Collectives take any type for which `tensor_traits<T>`
/// says where its contiguous elements live, how many there are, their dtype and
/// their device. Adapters ship for std::vector, std::array, std::span, typed and
/// untyped raw views; Eigen and LibTorch adapters are optional headers.

#include "unison/core/dtype.hpp"

#include <array>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace unison {

/// Where a tensor's memory lives: host memory, or the memory of CUDA device `index`.
struct device {
    enum class kind : std::uint8_t { host, cuda };

    kind type = kind::host;
    int index = -1;

    /// Host (CPU) memory.
    static constexpr device host() noexcept { return {}; }
    /// Memory of CUDA device `i`.
    static constexpr device cuda(int i) noexcept { return {kind::cuda, i}; }

    constexpr bool is_host() const noexcept { return type == kind::host; }
    constexpr bool is_cuda() const noexcept { return type == kind::cuda; }
    friend constexpr bool operator==(device, device) noexcept = default;
};

/// "host" or "cuda:N".
inline std::string to_string(device d) {
    return d.is_host() ? std::string("host") : "cuda:" + std::to_string(d.index);
}

/// Customization point: specialize for a tensor type `T` with
///   static (const) void* data(T&)        -- first element, contiguous storage
///   static std::size_t   size(const T&)  -- number of elements
///   static dtype         type(const T&)  -- element type
///   static unison::device location(const T&)
/// `data` on a const T returns `const void*`; on a non-const T, `void*` when
/// the elements are writable.
template <class T>
struct tensor_traits {};

/// A type whose elements unison can read.
template <class T>
concept tensor = requires(const std::remove_cvref_t<T>& t) {
    { tensor_traits<std::remove_cvref_t<T>>::data(t) } -> std::convertible_to<const void*>;
    { tensor_traits<std::remove_cvref_t<T>>::size(t) } -> std::convertible_to<std::size_t>;
    { tensor_traits<std::remove_cvref_t<T>>::type(t) } -> std::same_as<dtype>;
    { tensor_traits<std::remove_cvref_t<T>>::location(t) } -> std::same_as<device>;
};

/// A tensor whose elements unison can also write (an output buffer).
template <class T>
concept writable_tensor = tensor<T> && !std::is_const_v<std::remove_reference_t<T>> &&
                          requires(std::remove_cvref_t<T> & t) {
    { tensor_traits<std::remove_cvref_t<T>>::data(t) } -> std::convertible_to<void*>;
};

/// Pointer to the first element of `t`.
template <tensor T>
const void* tensor_data(const T& t) {
    return tensor_traits<std::remove_cvref_t<T>>::data(t);
}
/// Writable pointer to the first element of `t`.
template <writable_tensor T>
void* tensor_data(T& t) {
    return tensor_traits<std::remove_cvref_t<T>>::data(t);
}
/// Number of elements of `t`.
template <tensor T>
std::size_t tensor_size(const T& t) {
    return tensor_traits<std::remove_cvref_t<T>>::size(t);
}
/// Element type of `t`.
template <tensor T>
dtype tensor_dtype(const T& t) {
    return tensor_traits<std::remove_cvref_t<T>>::type(t);
}
/// Device holding the elements of `t`.
template <tensor T>
device tensor_device(const T& t) {
    return tensor_traits<std::remove_cvref_t<T>>::location(t);
}

/// A typed, non-owning view of `size` contiguous elements at `data` on `location`.
/// Use `view<const T>` for read-only input.
template <element T>
struct view {
    T* data = nullptr;
    std::size_t size = 0;
    device location = device::host();

    /// The same elements as a span (meaningful to dereference on the host only).
    operator std::span<T>() const noexcept { return {data, size}; }
};

/// An untyped, non-owning view: `count` elements of dtype `type` at `data`.
struct buffer {
    void* data = nullptr;
    std::size_t count = 0;
    dtype type = dtype::u8;
    device location = device::host();
};

/// The read-only counterpart of `buffer`.
struct const_buffer {
    const void* data = nullptr;
    std::size_t count = 0;
    dtype type = dtype::u8;
    device location = device::host();

    constexpr const_buffer() noexcept = default;
    constexpr const_buffer(const void* d, std::size_t n, dtype t,
                           device loc = device::host()) noexcept
        : data(d), count(n), type(t), location(loc) {}
    constexpr const_buffer(const buffer& b) noexcept // NOLINT: a writable buffer is readable
        : data(b.data), count(b.count), type(b.type), location(b.location) {}
};

namespace detail {
/// Traits shared by host containers whose elements are `T` and expose data()/size().
template <class C, class T>
struct contiguous_host_traits {
    static auto data(C& c) noexcept {
        if constexpr (std::is_const_v<T>) {
            return static_cast<const void*>(std::data(c));
        } else {
            return static_cast<void*>(std::data(c));
        }
    }
    static const void* data(const C& c) noexcept { return std::data(c); }
    static std::size_t size(const C& c) noexcept { return std::size(c); }
    static dtype type(const C&) noexcept { return dtype_of<T>; }
    static device location(const C&) noexcept { return device::host(); }
};
} // namespace detail

template <element T, class A>
struct tensor_traits<std::vector<T, A>> : detail::contiguous_host_traits<std::vector<T, A>, T> {};

template <element T, std::size_t N>
struct tensor_traits<std::array<T, N>> : detail::contiguous_host_traits<std::array<T, N>, T> {};

template <element T, std::size_t E>
struct tensor_traits<std::span<T, E>> : detail::contiguous_host_traits<std::span<T, E>, T> {};

template <element T>
struct tensor_traits<view<T>> {
    static auto data(const view<T>& v) noexcept {
        if constexpr (std::is_const_v<T>) {
            return static_cast<const void*>(v.data);
        } else {
            return static_cast<void*>(v.data);
        }
    }
    static std::size_t size(const view<T>& v) noexcept { return v.size; }
    static dtype type(const view<T>&) noexcept { return dtype_of<T>; }
    static device location(const view<T>& v) noexcept { return v.location; }
};

template <>
struct tensor_traits<buffer> {
    static void* data(const buffer& b) noexcept { return b.data; }
    static std::size_t size(const buffer& b) noexcept { return b.count; }
    static dtype type(const buffer& b) noexcept { return b.type; }
    static device location(const buffer& b) noexcept { return b.location; }
};

template <>
struct tensor_traits<const_buffer> {
    static const void* data(const const_buffer& b) noexcept { return b.data; }
    static std::size_t size(const const_buffer& b) noexcept { return b.count; }
    static dtype type(const const_buffer& b) noexcept { return b.type; }
    static device location(const const_buffer& b) noexcept { return b.location; }
};

static_assert(writable_tensor<std::vector<float>&>);
static_assert(tensor<const std::vector<float>&> && !writable_tensor<const std::vector<float>&>);
static_assert(writable_tensor<std::span<double>> && !writable_tensor<std::span<const double>>);
static_assert(writable_tensor<std::array<bf16, 4>&>);
static_assert(writable_tensor<view<float>> && !writable_tensor<view<const float>>);
static_assert(writable_tensor<buffer> && !writable_tensor<const_buffer> && tensor<const_buffer>);

/// An untyped read-only description of `t`.
template <tensor T>
const_buffer as_const_buffer(const T& t) {
    return {tensor_data(t), tensor_size(t), tensor_dtype(t), tensor_device(t)};
}
/// An untyped writable description of `t`.
template <writable_tensor T>
buffer as_buffer(T&& t) {
    return {tensor_data(t), tensor_size(t), tensor_dtype(t), tensor_device(t)};
}

} // namespace unison
