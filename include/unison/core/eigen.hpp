#pragma once

/// \file
/// Optional adapter: dense Eigen objects as unison tensors. Link `unison::eigen`
/// (which brings Eigen 3) and include this header; then `Eigen::VectorXd`,
/// `Eigen::MatrixXf`, `Eigen::ArrayXXi` and contiguous `Eigen::Map`s go straight
/// into the collectives:
///
///     Eigen::MatrixXf grad = ...;
///     unison::all_reduce(comm, grad, unison::reduce_op::avg);
///
/// A tensor is its coefficients in storage order (column-major unless the type says
/// `Eigen::RowMajor`); element-wise collectives do not care, while all_gather and
/// friends concatenate storage order. Every rank must use the same storage order.

#include "unison/core/tensor.hpp"

#include <Eigen/Core>

#include <cstddef>
#include <type_traits>

namespace unison {

namespace detail {

/// Traits shared by the Eigen adapters: `E` is an Eigen object whose coefficients
/// are stored contiguously, `Scalar` its (possibly const) coefficient type.
template <class E, class Scalar>
struct eigen_dense_traits {
    static auto data(E& e) noexcept {
        if constexpr (std::is_const_v<Scalar>) {
            return static_cast<const void*>(e.data());
        } else {
            return static_cast<void*>(e.data());
        }
    }
    static const void* data(const E& e) noexcept { return e.data(); }
    static std::size_t size(const E& e) noexcept { return static_cast<std::size_t>(e.size()); }
    static dtype type(const E&) noexcept { return dtype_of<Scalar>; }
    static device location(const E&) noexcept { return device::host(); }
};

/// True when an `Eigen::Map` with stride type `StrideType` over `PlainObject` always
/// addresses contiguous memory: unit (or default) inner stride, and the default
/// outer stride unless the object is a vector, where the outer stride is unused.
template <class PlainObject, class StrideType>
inline constexpr bool eigen_map_is_contiguous =
    (StrideType::InnerStrideAtCompileTime == 0 || StrideType::InnerStrideAtCompileTime == 1) &&
    (StrideType::OuterStrideAtCompileTime == 0 ||
     std::remove_const_t<PlainObject>::IsVectorAtCompileTime);

} // namespace detail

/// `Eigen::Matrix` of a unison element type (double, float, int64_t, int32_t, ...).
template <element Scalar, int Rows, int Cols, int Options, int MaxRows, int MaxCols>
struct tensor_traits<Eigen::Matrix<Scalar, Rows, Cols, Options, MaxRows, MaxCols>>
    : detail::eigen_dense_traits<Eigen::Matrix<Scalar, Rows, Cols, Options, MaxRows, MaxCols>,
                                 Scalar> {};

/// `Eigen::Array` of a unison element type.
template <element Scalar, int Rows, int Cols, int Options, int MaxRows, int MaxCols>
struct tensor_traits<Eigen::Array<Scalar, Rows, Cols, Options, MaxRows, MaxCols>>
    : detail::eigen_dense_traits<Eigen::Array<Scalar, Rows, Cols, Options, MaxRows, MaxCols>,
                                 Scalar> {};

/// `Eigen::Map` over contiguous memory; `Eigen::Map<const M>` is a read-only tensor.
/// Maps with a stride that may skip memory are rejected at compile time: copy them
/// into a plain object first.
template <class PlainObject, int MapOptions, class StrideType>
requires element<typename PlainObject::Scalar>
struct tensor_traits<Eigen::Map<PlainObject, MapOptions, StrideType>>
    : detail::eigen_dense_traits<
          Eigen::Map<PlainObject, MapOptions, StrideType>,
          std::conditional_t<std::is_const_v<PlainObject>, const typename PlainObject::Scalar,
                             typename PlainObject::Scalar>> {
    static_assert(detail::eigen_map_is_contiguous<PlainObject, StrideType>,
                  "unison: this Eigen::Map has a non-unit stride; collectives need contiguous "
                  "memory, so map with the default Eigen::Stride<0, 0> or copy into a plain "
                  "matrix first");
};

static_assert(writable_tensor<Eigen::VectorXd&>);
static_assert(tensor<const Eigen::MatrixXf&> && !writable_tensor<const Eigen::MatrixXf&>);
static_assert(writable_tensor<Eigen::ArrayXXi&>);
static_assert(writable_tensor<Eigen::Map<Eigen::VectorXd>>);
static_assert(tensor<Eigen::Map<const Eigen::VectorXd>> &&
              !writable_tensor<Eigen::Map<const Eigen::VectorXd>>);

} // namespace unison
