#pragma once

/// \file
/// `tcp_store`: the ranks of a job meet without MPI, on MASTER_ADDR and a port, as
/// torchrun and Kubernetes set them up (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
/// Rank 0 runs the store's server (store_server.hpp); every rank connects to it,
/// says who it is, and waits until every rank has. After that the store carries small
/// bootstrap data: NCCL's unique id (nccl_communicator::from_store), host names for
/// the local rank (store_launch), whatever else a program needs before its
/// communicators exist. It is not a data path: every byte goes through rank 0.
///
/// Every wait is bounded by `store_options::timeout`, and a wait that runs out names
/// the ranks it waited for and what the store knows of them (never arrived, arrived
/// and left, or connected but elsewhere). A store collective that waits for a rank
/// whose connection closed (it exited, crashed or was killed) does not wait for the
/// timeout: the server tells it at once, and it throws `peer_error` naming the rank.

#include "unison/comm/launcher.hpp"
#include "unison/comm/options.hpp"
#include "unison/core/error.hpp"
#include "unison/rendezvous/detail/protocol.hpp"
#include "unison/rendezvous/detail/socket.hpp"
#include "unison/rendezvous/store_server.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

namespace unison {

/// Where the ranks meet and who this one is.
struct store_options {
    /// The host that runs rank 0 (MASTER_ADDR): a name or an IPv4 or IPv6 address.
    std::string host = "127.0.0.1";
    /// The store's port on `host`. 0 lets the hosting rank take any free port, which
    /// only a test that passes it on by hand can use.
    std::uint16_t port = 29500;
    int rank = 0;
    int world_size = 1;
    /// Whether this rank runs the server; by default rank 0 does. false on every rank
    /// where a `tcp_store_server` runs elsewhere.
    std::optional<bool> host_server;
    /// Bound on every wait: for rank 0 to listen, for every rank to join, for a key.
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    /// Where `port` came from, for messages ("MASTER_PORT", ...).
    std::string port_source = "store_options::port";

    /// From the environment `get` reads (a `const char*(const char*)`): rank and world
    /// size from the launcher (detect_launch: torchrun's and Kubernetes' RANK and
    /// WORLD_SIZE, or an MPI launcher's or Slurm's), MASTER_ADDR, the port from
    /// UNISON_STORE_PORT if set, else MASTER_PORT, else (under torchrun, whose own
    /// store already listens on MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE=True)
    /// MASTER_PORT + 1; the timeout from UNISON_TIMEOUT. Throws `argument_error`
    /// naming the variable that is missing or malformed.
    template <class Getenv>
    static store_options from_env(Getenv&& get) {
        const char* operation = "store_options::from_env";
        const launch_info info = detect_launch(get);
        if (info.launcher == "none") {
            throw argument_error(-1, operation,
                                 "RANK and WORLD_SIZE are not set (nor an MPI launcher's or "
                                 "Slurm's rank variables): start the job with torchrun, or set "
                                 "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
        }
        store_options o;
        o.rank = info.rank;
        o.world_size = info.size;
        const char* host = get("MASTER_ADDR");
        if (host == nullptr || *host == '\0') {
            throw argument_error(info.rank, operation,
                                 "MASTER_ADDR is not set: it names the host of rank 0, where "
                                 "the ranks meet");
        }
        o.host = host;
        auto port = [&](const char* name) -> std::optional<std::uint16_t> {
            const char* v = get(name);
            if (v == nullptr) {
                return std::nullopt;
            }
            const auto n = detail::parse_count(v);
            if (!n || *n < 1 || *n > 65535) {
                throw argument_error(info.rank, operation,
                                     std::string(name) + "='" + v + "' is not a port (1-65535)");
            }
            return static_cast<std::uint16_t>(*n);
        };
        if (const auto p = port("UNISON_STORE_PORT")) {
            o.port = *p;
            o.port_source = "UNISON_STORE_PORT";
            return with_timeout(o);
        }
        const auto master = port("MASTER_PORT");
        if (!master) {
            throw argument_error(info.rank, operation,
                                 "MASTER_PORT is not set: it names the port where the ranks "
                                 "meet (or set UNISON_STORE_PORT)");
        }
        o.port = *master;
        o.port_source = "MASTER_PORT";
        const char* agent = get("TORCHELASTIC_USE_AGENT_STORE");
        const std::string_view a = agent != nullptr ? agent : "";
        if (a == "True" || a == "true" || a == "1") {
            if (*master == 65535) {
                throw argument_error(info.rank, operation,
                                     "torchrun's store holds MASTER_PORT=65535 and the port "
                                     "after it does not exist: set UNISON_STORE_PORT");
            }
            o.port = static_cast<std::uint16_t>(*master + 1);
            o.port_source = "MASTER_PORT + 1 (torchrun's own store listens on MASTER_PORT; "
                            "UNISON_STORE_PORT overrides)";
        }
        return with_timeout(o);
    }

    /// From this process's environment.
    static store_options from_env() {
        return from_env([](const char* name) -> const char* { return std::getenv(name); });
    }

private:
    static store_options with_timeout(store_options o) {
        o.timeout = comm_options::from_env().timeout;
        return o;
    }
};

/// A rank's connection to the job's store (and, on the hosting rank, the store).
/// Thread-safe: calls from several threads take turns.
class tcp_store {
public:
    /// Meets the other ranks: rank 0 (or `host_server`) starts the server; every rank
    /// connects (retrying until the host listens), is checked (its rank and world
    /// size against the store's, no rank twice) and waits until all have joined.
    /// Throws `timeout_error` naming the ranks that did not join, `argument_error`
    /// when the store refuses this rank and says why, `error` when the port cannot
    /// be bound.
    explicit tcp_store(store_options options) : s_(std::make_unique<state>()) {
        s_->options = std::move(options);
        // A year at most ("forever"): a longer one would overflow the clock's sums.
        s_->options.timeout =
            std::min<std::chrono::milliseconds>(s_->options.timeout, std::chrono::hours(24 * 365));
        const store_options& o = s_->options;
        const int rank = o.rank;
        if (o.world_size < 1 || rank < 0 || rank >= o.world_size) {
            throw argument_error(rank, "tcp_store",
                                 "rank " + std::to_string(rank) + " is out of range for " +
                                     std::to_string(o.world_size) + " ranks");
        }
        const auto deadline = detail::store_clock::now() + o.timeout;
        std::string connect_host = o.host;
        s_->port = o.port;
        if (o.host_server.value_or(rank == 0)) {
            try {
                s_->server = std::make_unique<tcp_store_server>(o.port, o.world_size, o.timeout);
            } catch (const error& e) {
                throw error(rank, "tcp_store",
                            "rank " + std::to_string(rank) + " cannot host the store on port " +
                                std::to_string(o.port) + " (" + o.port_source +
                                "): " + std::string(after_prefix(e.what())) +
                                ". Another job or program holds it: pick another port");
            }
            s_->port = s_->server->port();
            connect_host = "127.0.0.1"; // itself, whatever MASTER_ADDR resolves to
        }
        s_->address = o.host + ":" + std::to_string(s_->port);
        s_->where = "the store at " + s_->address;

        std::string why;
        s_->fd = detail::connect_tcp(connect_host, s_->port, deadline, why);
        if (!s_->fd) {
            throw timeout_error(rank, "tcp_store",
                                "no store at " + o.host + ":" + std::to_string(s_->port) + " (" +
                                    o.port_source + ") within " + seconds(o.timeout) + " (" + why +
                                    "): rank 0, which runs it, has not started or failed, or "
                                    "MASTER_ADDR or the port differ across ranks",
                                0);
        }
        try {
            greet(deadline);
            join(deadline);
        } catch (...) {
            if (s_->server) {
                // The others are waiting for their answers: let them have them (their
                // waits end within their timeouts) before the store goes.
                s_->fd.reset();
                s_->server->wait_until_none_connected(detail::store_clock::now() + o.timeout);
            }
            throw;
        }
    }

    /// From the environment (store_options::from_env()).
    static tcp_store from_env() { return tcp_store(store_options::from_env()); }

    tcp_store(tcp_store&&) noexcept = default;
    tcp_store& operator=(tcp_store&&) noexcept = default;

    /// Closes the connection. On the hosting rank, then waits (up to the timeout) for
    /// every other rank to close theirs, so that none loses the store under a call:
    /// keep the store alive for as long as any rank uses it.
    ~tcp_store() {
        if (!s_) {
            return;
        }
        s_->fd.reset();
        if (s_->server) {
            s_->server->wait_until_none_connected(detail::store_clock::now() + s_->options.timeout);
        }
    }

    int rank() const noexcept { return s_->options.rank; }
    int size() const noexcept { return s_->options.world_size; }
    /// MASTER_ADDR, as given.
    const std::string& host() const noexcept { return s_->options.host; }
    /// The port the store listens on (the one bound, where 0 was asked for).
    std::uint16_t port() const noexcept { return s_->port; }
    const store_options& options() const noexcept { return s_->options; }
    /// Every rank's host name (gethostname), by rank, as each reported it on joining.
    const std::vector<std::string>& hosts() const noexcept { return s_->hosts; }

    /// Sets `key` (not starting with "unison/", which the store keeps for itself).
    void set(std::string_view key, std::span<const std::byte> value) {
        check_key(key, "tcp_store::set");
        call(detail::store_wire::op::set, {std::string(key)}, value, 0, "tcp_store::set");
    }
    void set(std::string_view key, std::string_view value) {
        set(key, std::as_bytes(std::span(value.data(), value.size())));
    }

    /// The value of `key`, waiting up to the timeout for some rank to set it.
    std::vector<std::byte> get(std::string_view key) {
        const std::string what = "tcp_store::get '" + std::string(key) + "'";
        check_key(key, what.c_str());
        std::vector<std::vector<std::byte>> values;
        if (!get_all({std::string(key)}, s_->options.timeout, what, values)) {
            throw timeout_error(rank(), what,
                                "no rank set it within " + seconds(s_->options.timeout), 0);
        }
        return std::move(values[0]);
    }

    /// Whether `key` is set now (no wait).
    bool check(std::string_view key) {
        check_key(key, "tcp_store::check");
        std::vector<std::vector<std::byte>> values;
        return get_all({std::string(key)}, std::chrono::milliseconds(0), "tcp_store::check",
                       values);
    }

    /// Adds `delta` to the 64-bit counter `key` (0 when unset) and returns the sum.
    std::int64_t add(std::string_view key, std::int64_t delta) {
        check_key(key, "tcp_store::add");
        return add_raw(std::string(key), delta, "tcp_store::add");
    }

    /// Removes `key` (nothing when unset).
    void erase(std::string_view key) {
        check_key(key, "tcp_store::erase");
        call(detail::store_wire::op::erase, {std::string(key)}, {}, 0, "tcp_store::erase");
    }

    /// Every rank's `value`, by rank. Collective: every rank calls the store's
    /// collectives (all_gather, broadcast, barrier) in the same order, with the same
    /// names; a rank that calls another one or another name is a `mismatch_error`,
    /// one that does not come within the timeout a `timeout_error` naming it, and one
    /// that left (its connection closed) before it came a `peer_error` naming it, as
    /// soon as the store sees the connection close.
    std::vector<std::vector<std::byte>> all_gather(std::string_view name,
                                                   std::span<const std::byte> value) {
        return collective("all_gather", name, value, -1);
    }

    /// `value` of rank `root`, on every rank (the others' `value` is ignored).
    std::vector<std::byte> broadcast(std::string_view name, std::span<const std::byte> value,
                                     int root = 0) {
        if (root < 0 || root >= size()) {
            throw argument_error(rank(), "tcp_store::broadcast",
                                 "root " + std::to_string(root) + " is out of range for " +
                                     std::to_string(size()) + " ranks");
        }
        auto v = collective("broadcast", name, value, root);
        return std::move(v[static_cast<std::size_t>(root)]);
    }

    /// Returns once every rank has called it.
    void barrier(std::string_view name = "barrier") { collective("barrier", name, {}, -1); }

    /// The ranks whose connection to the store has closed (they exited, crashed or
    /// were killed), by rank; when no more than `known` have, waits up to `wait` for
    /// one more. Not collective: a backend whose own connection to a peer broke asks
    /// here which rank is gone, since the store sees a process's end as soon as its
    /// kernel closes the socket. Throws `error` when the store itself cannot be
    /// reached (its host process is gone too).
    std::vector<int> departed(std::chrono::milliseconds wait, std::size_t known = 0) {
        missing_keys m;
        std::vector<std::vector<std::byte>> values;
        // A key that is never set: the server answers at `wait`, or as soon as more
        // than `known` ranks have left, with every rank's state either way.
        if (get_all({"unison/departed"}, std::max(wait, std::chrono::milliseconds(1)),
                    "tcp_store::departed", values, &m, std::uint64_t{known})) {
            return {};
        }
        std::vector<int> gone;
        for (int r = 0; r < size(); ++r) {
            if (m.states[static_cast<std::size_t>(r)] ==
                static_cast<std::uint8_t>(detail::store_wire::rank_state::left)) {
                gone.push_back(r);
            }
        }
        return gone;
    }

private:
    struct state {
        store_options options;
        std::unique_ptr<tcp_store_server> server;
        detail::socket_fd fd;
        std::uint16_t port = 0;
        std::string address; ///< host:port
        std::string where;   ///< "the store at host:port"
        std::vector<std::string> hosts;
        std::mutex mutex;
        std::string broken;      ///< why the connection is unusable, once it is
        std::uint64_t calls = 0; ///< store collectives so far
    };

    struct reply {
        detail::store_wire::reply_status status = detail::store_wire::reply_status::ok;
        std::vector<std::byte> payload;
    };

    static std::string seconds(std::chrono::milliseconds t) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(t.count()) / 1000.0);
        return buf;
    }

    /// An error's text without its "unison: ...: " prefix.
    static std::string_view after_prefix(std::string_view what) {
        const std::size_t at = what.rfind(": ");
        return at == std::string_view::npos ? what : what.substr(at + 2);
    }

    /// The payload length in a reply's 9-byte head (status, then u64 little-endian).
    static std::uint64_t payload_length(const std::uint8_t (&head)[9]) noexcept {
        std::uint64_t n = 0;
        for (int i = 0; i < 8; ++i) {
            n |= static_cast<std::uint64_t>(head[1 + i]) << (8 * i);
        }
        return n;
    }

    void check_key(std::string_view key, const char* operation) const {
        if (key.empty() || key.size() > detail::store_wire::max_key_bytes) {
            throw argument_error(rank(), operation,
                                 "a key has 1 to " +
                                     std::to_string(detail::store_wire::max_key_bytes) +
                                     " bytes, this one " + std::to_string(key.size()));
        }
        if (key.substr(0, 7) == "unison/") {
            throw argument_error(rank(), operation,
                                 "key '" + std::string(key) +
                                     "': keys starting with 'unison/' are the store's own");
        }
    }

    void send_or_throw(const std::vector<std::byte>& bytes, const std::string& what) {
        const auto deadline = detail::store_clock::now() + s_->options.timeout;
        const detail::io_result r =
            detail::send_all(s_->fd.get(), bytes.data(), bytes.size(), deadline);
        if (r.status != detail::io_status::ok) {
            fail(r, what, "sending to");
        }
    }

    /// Reads one reply (status, payload) before `deadline`.
    reply receive_or_throw(detail::store_clock::time_point deadline, const std::string& what) {
        std::uint8_t head[9];
        detail::io_result r = detail::recv_all(s_->fd.get(), head, sizeof head, deadline);
        if (r.status != detail::io_status::ok) {
            fail(r, what, "waiting for");
        }
        const std::uint64_t n = payload_length(head);
        if (n > detail::store_wire::max_value_bytes * 2) {
            s_->fd.reset(); // the rest of the stream cannot be read in step any more
            s_->broken = s_->where + " sent a reply too large to take";
            throw error(rank(), what, s_->broken);
        }
        reply out;
        out.status = static_cast<detail::store_wire::reply_status>(head[0]);
        out.payload.resize(static_cast<std::size_t>(n));
        r = detail::recv_all(s_->fd.get(), out.payload.data(), out.payload.size(), deadline);
        if (r.status != detail::io_status::ok) {
            fail(r, what, "waiting for");
        }
        return out;
    }

    [[noreturn]] void fail(const detail::io_result& r, const std::string& what, const char* doing) {
        s_->fd.reset();
        switch (r.status) {
        case detail::io_status::timeout:
            s_->broken = std::string(doing) + " " + s_->where + " for " +
                         seconds(s_->options.timeout) +
                         " without an answer: rank 0, which runs it, is stopped or overloaded";
            throw timeout_error(rank(), what, s_->broken, 0);
        case detail::io_status::closed:
            s_->broken =
                s_->where + " closed the connection: rank 0, which runs it, exited or crashed";
            throw peer_error(rank(), what, s_->broken, 0);
        default:
            s_->broken = std::string(doing) + " " + s_->where + ": " + detail::errno_text(r.error);
            throw error(rank(), what, s_->broken);
        }
    }

    /// One request and its reply; throws on a broken connection or a refusal.
    reply call(detail::store_wire::op op, const std::vector<std::string>& keys,
               std::span<const std::byte> value, std::int64_t argument, const std::string& what,
               std::chrono::milliseconds server_wait = std::chrono::milliseconds(0)) {
        std::lock_guard lock(s_->mutex);
        if (!s_->fd) {
            throw error(rank(), what, "the connection to the store failed earlier: " + s_->broken);
        }
        detail::store_wire::writer w;
        w.u64(0); // the length of the rest, filled in below
        w.u8(static_cast<std::uint8_t>(op));
        w.u32(static_cast<std::uint32_t>(keys.size()));
        for (const std::string& k : keys) {
            w.bytes(k);
        }
        w.bytes(value);
        w.i64(argument);
        const std::uint64_t rest = w.buffer().size() - 8;
        for (int i = 0; i < 8; ++i) {
            w.buffer()[static_cast<std::size_t>(i)] = static_cast<std::byte>(rest >> (8 * i));
        }
        send_or_throw(w.buffer(), what);
        // The server answers a waiting get at its own deadline; allow for the trip.
        const auto deadline = detail::store_clock::now() + server_wait + s_->options.timeout;
        reply r = receive_or_throw(deadline, what);
        if (r.status == detail::store_wire::reply_status::refused) {
            throw argument_error(
                rank(), what,
                s_->where + " refused: " +
                    std::string(reinterpret_cast<const char*>(r.payload.data()), r.payload.size()));
        }
        return r;
    }

    /// What a get that ran out of time (or heard that a rank left) learnt: which keys
    /// exist, each rank's state, and whether a departure ended it early.
    struct missing_keys {
        std::vector<bool> present;
        std::vector<std::uint8_t> states;
        bool departed = false;        ///< answered early: a rank left while it waited
        std::uint64_t departures = 0; ///< ranks that have left, when departed
    };

    /// Gets every key, waiting up to `wait`. True with `values` filled, or false with
    /// `values` empty and `missing` (when given) filled.
    /// With `departures` (the number of ranks this caller knows to have left), the
    /// server also answers early, false with `missing->departed`, as soon as more
    /// ranks than that have left.
    bool get_all(const std::vector<std::string>& keys, std::chrono::milliseconds wait,
                 const std::string& what, std::vector<std::vector<std::byte>>& values,
                 missing_keys* missing = nullptr,
                 std::optional<std::uint64_t> departures = std::nullopt) {
        detail::store_wire::writer seen;
        if (departures) {
            seen.u64(*departures);
        }
        const reply r =
            call(detail::store_wire::op::get, keys, seen.buffer(), wait.count(), what, wait);
        values.clear();
        const bool departed = r.status == detail::store_wire::reply_status::departed;
        if (r.status == detail::store_wire::reply_status::timeout || departed) {
            if (missing != nullptr) {
                missing->present.assign(keys.size(), false);
                missing->states.assign(static_cast<std::size_t>(size()), 0);
                const std::size_t tail = departed ? 8 : 0;
                const std::size_t n = r.payload.size() >= tail ? r.payload.size() - tail : 0;
                for (std::size_t i = 0; i < n; ++i) {
                    const auto b = static_cast<std::uint8_t>(r.payload[i]);
                    if (i < keys.size()) {
                        missing->present[i] = b != 0;
                    } else if (i - keys.size() < missing->states.size()) {
                        missing->states[i - keys.size()] = b;
                    }
                }
                missing->departed = departed;
                missing->departures = 0;
                for (std::size_t i = 0; i < tail && n + i < r.payload.size(); ++i) {
                    missing->departures |=
                        static_cast<std::uint64_t>(static_cast<std::uint8_t>(r.payload[n + i]))
                        << (8 * i);
                }
            }
            return false;
        }
        detail::store_wire::reader rd(r.payload);
        for (std::size_t i = 0; i < keys.size(); ++i) {
            std::span<const std::byte> v;
            if (!rd.bytes(v, detail::store_wire::max_value_bytes)) {
                throw error(rank(), what, s_->where + " sent a malformed reply");
            }
            values.emplace_back(v.begin(), v.end());
        }
        return true;
    }

    std::int64_t add_raw(const std::string& key, std::int64_t delta, const std::string& what) {
        const reply r = call(detail::store_wire::op::add, {key}, {}, delta, what);
        detail::store_wire::reader rd(r.payload);
        std::int64_t v = 0;
        if (!rd.i64(v)) {
            throw error(rank(), what, s_->where + " sent a malformed reply");
        }
        return v;
    }

    /// The ranks of `from` whose keys are missing, as "ranks 2, 5-7 of 8", with what
    /// the store knows of each: never connected, refused, connected (so slow, or
    /// elsewhere), or left.
    std::string describe_missing(const std::vector<int>& from, const missing_keys& m) const {
        using detail::store_wire::rank_state;
        std::vector<int> ranks;
        std::vector<int> groups[4];
        for (std::size_t i = 0; i < from.size(); ++i) {
            if (m.present[i]) {
                continue;
            }
            const int r = from[i];
            ranks.push_back(r);
            const auto s = static_cast<rank_state>(m.states[static_cast<std::size_t>(r)]);
            groups[s == rank_state::left        ? 2
                   : s == rank_state::connected ? 1
                   : s == rank_state::refused   ? 3
                                                : 0]
                .push_back(r);
        }
        const char* say[4] = {
            "never connected", "connected but did not get here (slow, or stuck elsewhere)",
            "connected and then left (exited or crashed)",
            ("connected and was refused by the store: it was started for another WORLD_SIZE or "
             "runs another unison version, and its own error says which")};
        std::string why;
        const int kinds =
            !groups[0].empty() + !groups[1].empty() + !groups[2].empty() + !groups[3].empty();
        for (int g = 0; g < 4; ++g) {
            if (!groups[g].empty()) {
                why += (why.empty() ? "" : "; ") +
                       (kinds > 1 ? rank_list(groups[g]) + ": " : std::string()) + say[g];
            }
        }
        return (ranks.size() == 1 ? "rank " : "ranks ") + rank_list(ranks) + " of " +
               std::to_string(size()) + " (" + why + ")";
    }

    /// "0, 2-5, 7".
    static std::string rank_list(const std::vector<int>& ranks) {
        std::string out;
        for (std::size_t i = 0; i < ranks.size();) {
            std::size_t j = i;
            while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) {
                ++j;
            }
            out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
            if (j > i) {
                out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
            }
            i = j + 1;
        }
        return out;
    }

    void greet(detail::store_clock::time_point deadline) {
        char name[256] = {};
        if (::gethostname(name, sizeof name - 1) != 0) {
            name[0] = '\0';
        }
        detail::store_wire::writer w;
        w.u32(detail::store_wire::magic);
        w.u32(detail::store_wire::version);
        w.u32(static_cast<std::uint32_t>(rank()));
        w.u32(static_cast<std::uint32_t>(size()));
        w.u64(static_cast<std::uint64_t>(::getpid()));
        w.bytes(std::string_view(name));
        const detail::io_result r =
            detail::send_all(s_->fd.get(), w.buffer().data(), w.buffer().size(), deadline);
        std::uint8_t head[9];
        const detail::io_result a =
            r.status == detail::io_status::ok
                ? detail::recv_all(s_->fd.get(), head, sizeof head, deadline)
                : r;
        if (a.status != detail::io_status::ok) {
            s_->fd.reset();
            const std::string hint =
                "; is another program listening there? (torchrun's own store listens on "
                "MASTER_PORT: unison uses MASTER_PORT + 1 under torchrun, or UNISON_STORE_PORT)";
            if (a.status == detail::io_status::timeout) {
                throw timeout_error(rank(), "tcp_store",
                                    "connected to " + s_->address +
                                        " but no answer to this rank's greeting within " +
                                        seconds(s_->options.timeout) + hint,
                                    0);
            }
            throw error(rank(), "tcp_store",
                        s_->address + " closed the connection on this rank's greeting" + hint);
        }
        const std::uint64_t n = payload_length(head);
        std::string message(static_cast<std::size_t>(std::min<std::uint64_t>(n, 65536)), '\0');
        if (detail::recv_all(s_->fd.get(), message.data(), message.size(), deadline).status !=
            detail::io_status::ok) {
            s_->fd.reset();
            throw error(rank(), "tcp_store", s_->where + " broke off its answer to the greeting");
        }
        if (head[0] != 0) {
            s_->fd.reset();
            throw argument_error(rank(), "tcp_store", s_->where + " refused " + message);
        }
    }

    /// Waits until every rank has joined; keeps their host names.
    void join(detail::store_clock::time_point deadline) {
        std::vector<std::string> keys;
        for (int r = 0; r < size(); ++r) {
            keys.push_back("unison/joined/" + std::to_string(r));
        }
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - detail::store_clock::now());
        std::vector<std::vector<std::byte>> values;
        missing_keys missing;
        if (!get_all(keys, std::max(left, std::chrono::milliseconds(1)), "tcp_store", values,
                     &missing)) {
            std::vector<int> all(static_cast<std::size_t>(size()));
            for (int r = 0; r < size(); ++r) {
                all[static_cast<std::size_t>(r)] = r;
            }
            throw timeout_error(rank(), "tcp_store",
                                "rendezvous at " + s_->address + ": " +
                                    describe_missing(all, missing) + " did not join within " +
                                    seconds(s_->options.timeout),
                                0);
        }
        for (const auto& v : values) {
            s_->hosts.emplace_back(reinterpret_cast<const char*>(v.data()), v.size());
        }
    }

    /// The store collectives: every rank publishes "kind name" and its value under the
    /// call's number; each reads the ranks it needs and checks that they made the same
    /// call. The last rank through removes the keys.
    std::vector<std::vector<std::byte>> collective(std::string_view kind, std::string_view name,
                                                   std::span<const std::byte> value, int root) {
        std::uint64_t call_number = 0;
        {
            std::lock_guard lock(s_->mutex);
            call_number = s_->calls++;
        }
        // The root is part of the call: ranks that broadcast from different roots
        // must not each read back their own value.
        const std::string signature = std::string(kind) + " '" + std::string(name) + "'" +
                                      (root >= 0 ? " from rank " + std::to_string(root) : "");
        const std::string what = "tcp_store::" + std::string(kind) + " '" + std::string(name) +
                                 "' (store collective #" + std::to_string(call_number) + ")";
        const std::string prefix = "unison/c/" + std::to_string(call_number) + "/";
        // Every rank publishes its call (and, unless it is not the root of a
        // broadcast, its value) and reads every rank's, so each checks all the others.
        {
            detail::store_wire::writer w;
            w.bytes(signature);
            w.bytes(root < 0 || root == rank() ? value : std::span<const std::byte>{});
            call(detail::store_wire::op::set, {prefix + std::to_string(rank())}, w.buffer(), 0,
                 what);
        }
        std::vector<int> from;
        std::vector<std::string> keys;
        for (int r = 0; r < size(); ++r) {
            from.push_back(r);
            keys.push_back(prefix + std::to_string(r));
        }
        std::vector<std::vector<std::byte>> values;
        const auto deadline = detail::store_clock::now() + s_->options.timeout;
        std::uint64_t departures = 0;
        for (;;) {
            missing_keys missing;
            const auto wait = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           deadline - detail::store_clock::now()),
                                       std::chrono::milliseconds(1));
            if (get_all(keys, wait, what, values, &missing, departures)) {
                break;
            }
            // A rank this call waits for has left (its connection closed: it exited,
            // crashed or was killed): it will never get here.
            std::vector<int> gone;
            for (std::size_t i = 0; i < from.size(); ++i) {
                const int r = from[i];
                if (!missing.present[i] &&
                    missing.states[static_cast<std::size_t>(r)] ==
                        static_cast<std::uint8_t>(detail::store_wire::rank_state::left)) {
                    gone.push_back(r);
                }
            }
            if (!gone.empty()) {
                throw peer_error(rank(), what,
                                 (gone.size() == 1 ? "rank " : "ranks ") + rank_list(gone) +
                                     " of " + std::to_string(size()) +
                                     " left before making this call (its connection to the "
                                     "store closed: it exited, crashed or was killed), so it "
                                     "will never come; this call waited for " +
                                     describe_missing(from, missing),
                                 gone.front());
            }
            if (!missing.departed) {
                throw timeout_error(rank(), what,
                                    describe_missing(from, missing) + " did not get here within " +
                                        seconds(s_->options.timeout),
                                    call_number);
            }
            departures = missing.departures; // another rank left: wait on
        }
        std::vector<std::vector<std::byte>> out;
        for (std::size_t i = 0; i < values.size(); ++i) {
            detail::store_wire::reader rd(values[i]);
            std::string theirs;
            std::span<const std::byte> data;
            if (!rd.string(theirs, detail::store_wire::max_key_bytes) ||
                !rd.bytes(data, detail::store_wire::max_value_bytes)) {
                throw error(rank(), what,
                            "rank " + std::to_string(from[i]) + "'s entry is malformed");
            }
            if (theirs != signature) {
                throw mismatch_error(rank(), what,
                                     "rank " + std::to_string(from[i]) + " called " + theirs +
                                         " as store collective #" + std::to_string(call_number) +
                                         ", this rank " + signature,
                                     from[i], "operation");
            }
            out.emplace_back(data.begin(), data.end());
        }
        if (add_raw(prefix + "done", 1, what) == size()) {
            std::vector<std::string> all;
            for (int r = 0; r < size(); ++r) {
                all.push_back(prefix + std::to_string(r));
            }
            all.push_back(prefix + "done");
            call(detail::store_wire::op::erase, all, {}, 0, what);
        }
        return out;
    }

    std::unique_ptr<state> s_;
};

} // namespace unison
