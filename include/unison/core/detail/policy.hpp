#pragma once

/// \file
/// The machinery behind policy lists such as
/// `ddp<Comm, policy::mixed_precision<dtype::f32, dtype::bf16>, policy::unused_is_error>`.
///
/// A policy is a small type that changes code (a dtype, a hook, a sharding
/// strategy); numbers are options, not policies. Every policy names its *kind*
/// (`using kind = policy::kind::gradient_memory;`), and each kind is a type of its
/// own with its default (`using default_policy = ...;`). An engine lists the kinds
/// it takes; `policy_set` checks a list against them and picks, per kind, the one
/// policy given or the default. Adding a policy of an existing kind is one
/// definition, with its `kind` line, and nothing else.
///
/// Misassembled lists are compile errors whose first line names the culprit:
///   not_a_policy_of<Engine, Argument>        an argument the engine does not take
///   more_than_one_policy_of<Kind, policies<P, Q>>   two policies of one kind

#include <cstddef>
#include <type_traits>

namespace unison::detail {

template <class...>
inline constexpr bool always_false = false;

/// A list of types (kinds, or the policies of one kind in an error).
template <class... Ts>
struct type_list {};
template <class... Kinds>
using kind_list = type_list<Kinds...>;
template <class... Ps>
using policies = type_list<Ps...>;

/// The kind of policy `P`: its `kind` member. A family of types that cannot carry
/// one (the optimizers) gets a specialization where its kind is defined.
template <class P>
struct kind_of {};
template <class P>
requires requires {
    typename P::kind;
}
struct kind_of<P> {
    using type = typename P::kind;
};

/// True when `P` is a policy at all: it has a kind.
template <class P>
concept policy_type = requires {
    typename kind_of<P>::type;
};

/// Whether `P` is a policy of one of `Kinds`.
template <class P, class... Kinds>
consteval bool of_kind() {
    if constexpr (policy_type<P>) {
        return (std::is_same_v<typename kind_of<P>::type, Kinds> || ...);
    } else {
        return false;
    }
}

/// Instantiated for an argument of `Engine`'s policy list that is not one of its
/// policies; the compiler's first line names both.
template <class Engine, class Argument>
struct not_a_policy_of {
    static_assert(always_false<Argument>,
                  "unison: an argument after the communicator is not a policy this engine takes "
                  "(it is `Argument` in not_a_policy_of<Engine, Argument> above)");
};

/// Instantiated when more than one policy of `Kind` was given; the compiler's first
/// line names the kind and the policies.
template <class Kind, class Policies>
struct more_than_one_policy_of {
    static_assert(always_false<Kind>,
                  "unison: more than one policy of one kind was given; give one "
                  "(they are named in more_than_one_policy_of<Kind, policies<...>> above)");
};

template <class Kind, class List, class... Ps>
struct filter_kind {
    using type = List;
};
template <class Kind, class... Done, class P, class... Ps>
struct filter_kind<Kind, type_list<Done...>, P, Ps...> {
    using type = typename filter_kind<
        Kind, std::conditional_t<of_kind<P, Kind>(), type_list<Done..., P>, type_list<Done...>>,
        Ps...>::type;
};

template <class Default, class Kind, class... Ps>
struct select_kind {
    using type = Default;
};
template <class Default, class Kind, class P, class... Ps>
struct select_kind<Default, Kind, P, Ps...> {
    using type =
        std::conditional_t<of_kind<P, Kind>(), P, typename select_kind<Default, Kind, Ps...>::type>;
};

template <class Engine, class Kinds, class... Ps>
struct policy_set;

/// The policies `Ps` of an engine that takes `Kinds`. `valid` is true, and using
/// it in a static_assert reports every misassembly (see the file comment).
template <class Engine, class... Kinds, class... Ps>
struct policy_set<Engine, kind_list<Kinds...>, Ps...> {
    /// The policy of `Kind` given, or `Default` (the kind's own default unless the
    /// engine chooses another).
    template <class Kind, class Default = typename Kind::default_policy>
    using get = typename select_kind<Default, Kind, Ps...>::type;

    /// Whether a policy of `Kind` was given.
    template <class Kind>
    static constexpr bool has = (of_kind<Ps, Kind>() || ...);

private:
    template <class P>
    static consteval bool accepted() {
        if constexpr (!of_kind<P, Kinds...>()) {
            (void)sizeof(not_a_policy_of<Engine, P>);
        }
        return true;
    }
    template <class Kind>
    static consteval bool single() {
        if constexpr ((std::size_t{0} + ... + (of_kind<Ps, Kind>() ? 1u : 0u)) > 1) {
            (void)sizeof(
                more_than_one_policy_of<Kind,
                                        typename filter_kind<Kind, type_list<>, Ps...>::type>);
        }
        return true;
    }

public:
    static constexpr bool valid =
        (true && ... && accepted<Ps>()) && (true && ... && single<Kinds>());
};

} // namespace unison::detail
