#pragma once

/// \file
/// The machinery behind policy lists (`bucketed_reducer<C, policy::bucket_size<...>,
/// policy::reduce_dtype<dtype::bf16>>`): every policy type names its `category`;
/// a configuration picks, per category, the one policy given or a default. Whether
/// two policies of one category were given is answered here; the configuration
/// that uses it turns the answer into a static_assert with a message that names
/// the category.

#include <cstddef>
#include <type_traits>

namespace unison::detail {

/// True when `P` has a `category` member type, i.e. is a policy at all.
template <class P>
concept policy_type = requires {
    typename P::category;
};

/// The category of `P`, or void for a type that is not a policy (so a list holding
/// a stray type still gets to the static_assert that names the mistake).
template <class P>
struct category_of {
    using type = void;
};
template <policy_type P>
struct category_of<P> {
    using type = typename P::category;
};
template <class P>
using category_of_t = typename category_of<P>::type;

/// How many of `Ps` belong to `Category`.
template <class Category, class... Ps>
inline constexpr std::size_t count_category =
    (std::size_t{0} + ... +
     (std::is_same_v<category_of_t<Ps>, Category> ? std::size_t{1} : std::size_t{0}));

template <class Default, class Category, class... Ps>
struct select_policy {
    using type = Default;
};
template <class Default, class Category, class P, class... Ps>
struct select_policy<Default, Category, P, Ps...> {
    using type = std::conditional_t<std::is_same_v<category_of_t<P>, Category>, P,
                                    typename select_policy<Default, Category, Ps...>::type>;
};

/// The policy of `Category` among `Ps`, or `Default` when none is given.
template <class Default, class Category, class... Ps>
using select_policy_t = typename select_policy<Default, Category, Ps...>::type;

} // namespace unison::detail
