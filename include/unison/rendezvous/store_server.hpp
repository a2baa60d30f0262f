#pragma once

/// \file
/// `tcp_store_server`: the key-value store that the ranks of a job meet at. Rank 0's
/// `tcp_store` runs one on MASTER_ADDR:port; a launcher or a test may run one on its
/// own. One thread serves every connection with poll(): it never blocks on a rank, so
/// a rank that stops answering delays nobody but itself.
///
/// What it holds: keys (strings) with byte values, 64-bit counters (`add`), and which
/// ranks have joined, are connected, or have left. A `get` of keys that do not exist
/// yet waits on the server, up to the time the client gives, and then answers with
/// the keys that are still missing, so a client can name the ranks it waited for; a
/// get that asks to (the store collectives' do) is answered as soon as a rank
/// leaves, so that a rank killed mid-collective is known at once.

#include "unison/core/error.hpp"
#include "unison/rendezvous/detail/protocol.hpp"
#include "unison/rendezvous/detail/socket.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace unison {

/// The store's server: listens on a TCP port for the ranks of one job.
class tcp_store_server {
public:
    /// Listens on `port` (0: any free port; see port()) of every interface for a job
    /// of `world_size` ranks. A connection that has not said who it is within
    /// `idle_limit`, or does not take its refusal within it, is closed. Throws
    /// `error` when the port cannot be bound.
    tcp_store_server(std::uint16_t port, int world_size,
                     std::chrono::milliseconds idle_limit = std::chrono::minutes(5))
        : world_size_(world_size), idle_limit_(idle_limit) {
        if (world_size < 1) {
            throw argument_error(-1, "tcp_store_server",
                                 "world_size " + std::to_string(world_size) + " is not positive");
        }
        std::string why;
        listener_ = detail::listen_tcp(port, port_, why);
        if (!listener_) {
            throw error(-1, "tcp_store_server", why);
        }
        int fds[2];
        if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
            throw error(-1, "tcp_store_server", "pipe(): " + detail::errno_text(errno));
        }
        wake_read_.reset(fds[0]);
        wake_write_.reset(fds[1]);
        ranks_.assign(static_cast<std::size_t>(world_size), detail::store_wire::rank_state::absent);
        thread_ = std::thread([this] { run(); });
    }

    tcp_store_server(const tcp_store_server&) = delete;
    tcp_store_server& operator=(const tcp_store_server&) = delete;

    /// Stops serving at once; connected ranks see their connection close.
    ~tcp_store_server() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        const char byte = 1;
        [[maybe_unused]] const ssize_t n = ::write(wake_write_.get(), &byte, 1);
        thread_.join();
    }

    /// The port it listens on.
    std::uint16_t port() const noexcept { return port_; }
    int world_size() const noexcept { return world_size_; }

    /// Waits until at least `count` ranks are connected or `deadline` passes; returns
    /// whether they are (for a launcher, or a test that orders its ranks).
    bool wait_until_connected(int count, detail::store_clock::time_point deadline) {
        std::unique_lock lock(mutex_);
        return changed_.wait_until(lock, deadline, [&] { return connected_ >= count; });
    }

    /// Waits until no rank is connected (every rank has closed its store) or
    /// `deadline` passes; returns whether none is.
    bool wait_until_none_connected(detail::store_clock::time_point deadline) {
        std::unique_lock lock(mutex_);
        return changed_.wait_until(lock, deadline, [&] { return connected_ == 0; });
    }

private:
    using rank_state = detail::store_wire::rank_state;
    using clock = detail::store_clock;
#ifdef POLLRDHUP
    static constexpr short hangup_events = POLLRDHUP;
#else
    static constexpr short hangup_events = 0;
#endif

    struct connection {
        std::uint64_t id = 0;
        detail::socket_fd fd;
        std::vector<std::byte> in;
        std::vector<std::byte> out;
        std::size_t out_at = 0;
        bool greeted = false; ///< its hello was accepted
        bool closing = false; ///< close once `out` is sent
        bool dead = false;
        int rank = -1;
        /// Until it has said who it is, and while it is closing: when it is dropped.
        clock::time_point idle_deadline = clock::time_point::max();
        // The get it waits in, if any.
        bool waiting = false;
        std::uint64_t wait_id = 0;
        std::vector<std::string> wait_keys;
        std::size_t missing = 0;
        clock::time_point deadline{};
        bool watches_departures = false; ///< its get asked to hear of ranks that leave
        std::uint64_t departures_seen = 0;
    };

    void run() {
        std::vector<pollfd> fds;
        std::vector<std::uint64_t> ids;
        for (;;) {
            {
                std::lock_guard lock(mutex_);
                if (stop_) {
                    break;
                }
            }
            fds.clear();
            ids.clear();
            fds.push_back({wake_read_.get(), POLLIN, 0});
            int timeout = -1;
            auto until = [&](clock::time_point t) {
                const int left = detail::millis_until(t);
                timeout = timeout < 0 ? left : std::min(timeout, left);
            };
            // Out of descriptors, the listener stays readable: rest it a moment.
            const bool listening = clock::now() >= listener_resumes_;
            fds.push_back({listener_.get(), static_cast<short>(listening ? POLLIN : 0), 0});
            if (!listening) {
                until(listener_resumes_);
            }
            for (auto& [id, c] : connections_) {
                // A peer that hangs up while its get waits must still be noticed; one
                // that has not taken its last reply is not read (no unbounded queue).
                short events = hangup_events;
                if (!c.waiting && !c.closing && c.out_at >= c.out.size()) {
                    events |= POLLIN;
                }
                if (c.out_at < c.out.size()) {
                    events |= POLLOUT;
                }
                fds.push_back({c.fd.get(), events, 0});
                ids.push_back(id);
                if (c.waiting) {
                    until(c.deadline);
                }
                if (c.idle_deadline != clock::time_point::max()) {
                    until(c.idle_deadline);
                }
            }
            if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
                break; // cannot happen with valid descriptors; stop rather than spin
            }
            if (fds[0].revents != 0) {
                char drain[64];
                while (::read(wake_read_.get(), drain, sizeof drain) > 0) {
                }
            }
            if ((fds[1].revents & POLLIN) != 0) {
                accept_all();
            }
            for (std::size_t i = 0; i < ids.size(); ++i) {
                const short ev = fds[i + 2].revents;
                auto it = connections_.find(ids[i]);
                if (ev == 0 || it == connections_.end()) {
                    continue;
                }
                connection& c = it->second;
                if ((ev & POLLOUT) != 0) {
                    flush(c);
                    if (c.out_at >= c.out.size() && !c.in.empty()) {
                        process(ids[i], c); // what it sent while its reply was queued
                    }
                }
                if ((ev & POLLIN) != 0 && !c.waiting && !c.closing && c.out_at >= c.out.size()) {
                    receive(ids[i], c); // reads the end of the stream too
                } else if ((ev & (hangup_events | POLLHUP | POLLERR)) != 0) {
                    c.dead = true; // gone: nothing it asked for can be delivered
                }
            }
            expire_waits();
            reap();
        }
        std::lock_guard lock(mutex_);
        connections_.clear();
        connected_ = 0;
        changed_.notify_all();
    }

    void accept_all() {
        for (;;) {
            const int fd =
                ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                    errno != ECONNABORTED) {
                    listener_resumes_ = clock::now() + std::chrono::milliseconds(100);
                }
                return;
            }
            detail::set_nodelay(fd);
            connection c;
            c.id = next_id_++;
            c.fd.reset(fd);
            c.idle_deadline = clock::now() + idle_limit_;
            connections_.emplace(c.id, std::move(c));
        }
    }

    void receive(std::uint64_t id, connection& c) {
        std::byte chunk[65536];
        for (;;) {
            const ssize_t k = ::recv(c.fd.get(), chunk, sizeof chunk, MSG_DONTWAIT);
            if (k > 0) {
                c.in.insert(c.in.end(), chunk, chunk + k);
                if (static_cast<std::size_t>(k) < sizeof chunk) {
                    break;
                }
                continue;
            }
            if (k < 0 && errno == EINTR) {
                continue;
            }
            if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                c.dead = true;
                return;
            }
            break;
        }
        process(id, c);
    }

    /// Handles every complete message in `c.in`, stopping at a get that must wait.
    void process(std::uint64_t id, connection& c) {
        std::size_t used = 0;
        while (!c.waiting && !c.closing && !c.dead && c.out_at >= c.out.size()) {
            const std::span<const std::byte> rest(c.in.data() + used, c.in.size() - used);
            bool malformed = false;
            if (!c.greeted) {
                detail::store_wire::hello h;
                const std::size_t n = detail::store_wire::parse_hello(rest, h, malformed);
                if (malformed) {
                    c.dead = true; // not one of ours: nothing sensible to say
                    break;
                }
                if (n == 0) {
                    break;
                }
                used += n;
                greet(c, h);
                continue;
            }
            detail::store_wire::request r;
            const std::size_t n = detail::store_wire::parse_request(rest, r, malformed);
            if (malformed) {
                reply_text(c, detail::store_wire::reply_status::refused,
                           "malformed request (a limit exceeded or an unknown operation)");
                c.closing = true;
                c.idle_deadline = clock::now() + idle_limit_;
                break;
            }
            if (n == 0) {
                break;
            }
            used += n;
            handle(id, c, std::move(r));
        }
        c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(used));
        flush(c);
    }

    void greet(connection& c, const detail::store_wire::hello& h) {
        using detail::store_wire::reply_status;
        const std::string who = "rank " + std::to_string(h.rank) + " (host " + h.host + ", pid " +
                                std::to_string(h.pid) + ")";
        std::string refusal;
        if (h.version != detail::store_wire::version) {
            refusal = who + ": it speaks store protocol version " + std::to_string(h.version) +
                      " and the store " + std::to_string(detail::store_wire::version) +
                      " (the ranks run different unison versions)";
        } else if (h.world_size != world_size_) {
            refusal = who + ": it was started for " + std::to_string(h.world_size) +
                      " ranks and the store for " + std::to_string(world_size_) +
                      " (WORLD_SIZE differs across ranks)";
        } else if (h.rank < 0 || h.rank >= world_size_) {
            refusal =
                who + ": the rank is out of range for " + std::to_string(world_size_) + " ranks";
        } else if (ranks_[static_cast<std::size_t>(h.rank)] == rank_state::connected) {
            refusal = who + ": rank " + std::to_string(h.rank) + " is already connected from " +
                      peers_[h.rank] + " (two processes were given the same RANK)";
        }
        if (!refusal.empty()) {
            if (h.rank >= 0 && h.rank < world_size_) { // the others can say what became of it
                std::lock_guard lock(mutex_);
                rank_state& s = ranks_[static_cast<std::size_t>(h.rank)];
                if (s == rank_state::absent) {
                    s = rank_state::refused;
                }
            }
            reply_text(c, reply_status::refused, refusal);
            c.closing = true;
            c.idle_deadline = clock::now() + idle_limit_;
            return;
        }
        c.greeted = true;
        c.idle_deadline = clock::time_point::max();
        c.rank = h.rank;
        peers_[h.rank] = "host " + h.host + ", pid " + std::to_string(h.pid);
        {
            std::lock_guard lock(mutex_);
            ranks_[static_cast<std::size_t>(h.rank)] = rank_state::connected;
            ++connected_;
            changed_.notify_all();
        }
        reply(c, reply_status::ok, std::span<const std::byte>{});
        const std::string key = "unison/joined/" + std::to_string(h.rank);
        data_[key].assign(reinterpret_cast<const std::byte*>(h.host.data()),
                          reinterpret_cast<const std::byte*>(h.host.data()) + h.host.size());
        notify(key);
    }

    void handle(std::uint64_t id, connection& c, detail::store_wire::request r) {
        using detail::store_wire::op;
        using detail::store_wire::reply_status;
        const bool one_key = r.keys.size() == 1;
        switch (r.operation) {
        case op::set:
            if (!one_key) {
                return refuse(c, "set takes one key");
            }
            data_[r.keys[0]] = std::move(r.value);
            reply(c, reply_status::ok, std::span<const std::byte>{});
            notify(r.keys[0]);
            return;
        case op::add: {
            if (!one_key) {
                return refuse(c, "add takes one key");
            }
            std::vector<std::byte>& v = data_[r.keys[0]];
            if (!v.empty() && v.size() != 8) {
                return refuse(c, "key '" + r.keys[0] + "' holds " + std::to_string(v.size()) +
                                     " bytes, not a counter");
            }
            std::uint64_t old = 0;
            for (std::size_t i = 0; i < v.size(); ++i) {
                old |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(v[i])) << (8 * i);
            }
            const std::uint64_t now = old + static_cast<std::uint64_t>(r.argument);
            v.resize(8);
            for (std::size_t i = 0; i < 8; ++i) {
                v[i] = static_cast<std::byte>(now >> (8 * i));
            }
            detail::store_wire::writer w;
            w.i64(static_cast<std::int64_t>(now));
            reply(c, reply_status::ok, w.buffer());
            notify(r.keys[0]);
            return;
        }
        case op::erase:
            for (const std::string& k : r.keys) {
                data_.erase(k);
            }
            return reply(c, reply_status::ok, std::span<const std::byte>{});
        case op::get: {
            c.wait_keys = std::move(r.keys);
            c.wait_id = next_wait_++;
            c.missing = 0;
            for (const std::string& k : c.wait_keys) {
                c.missing += data_.find(k) == data_.end() ? 1 : 0;
            }
            c.watches_departures = r.value.size() == 8;
            if (c.watches_departures) {
                detail::store_wire::reader rd(r.value);
                (void)rd.u64(c.departures_seen);
            }
            if (c.missing == 0) {
                return answer_get(c);
            }
            if (c.watches_departures && departures_ > c.departures_seen) {
                return answer_missing(c, /*departed=*/true);
            }
            if (r.argument <= 0) {
                return answer_missing(c);
            }
            for (const std::string& k : c.wait_keys) {
                if (data_.find(k) == data_.end()) {
                    watchers_[k].emplace_back(id, c.wait_id);
                }
            }
            c.waiting = true;
            // A year at most: a larger wait would overflow the clock's arithmetic.
            const std::int64_t wait = std::min<std::int64_t>(r.argument, max_wait_ms);
            c.deadline = clock::now() + std::chrono::milliseconds(wait);
            return;
        }
        }
    }

    void refuse(connection& c, const std::string& why) {
        reply_text(c, detail::store_wire::reply_status::refused, why);
    }

    /// Wakes the gets that wait for `key`.
    void notify(const std::string& key) {
        const auto w = watchers_.find(key);
        if (w == watchers_.end()) {
            return;
        }
        const auto waiters = std::move(w->second);
        watchers_.erase(w);
        for (const auto& [id, wait] : waiters) {
            const auto it = connections_.find(id);
            if (it == connections_.end() || !it->second.waiting || it->second.wait_id != wait) {
                continue; // gone, or answered already
            }
            connection& c = it->second;
            if (--c.missing == 0) {
                c.waiting = false;
                answer_get(c);
                process(id, c); // anything it sent after the get
            }
        }
    }

    /// Answers a get whose keys all existed when it was last counted. A key erased
    /// in between makes it wait again.
    void answer_get(connection& c) {
        detail::store_wire::writer w;
        for (const std::string& k : c.wait_keys) {
            const auto it = data_.find(k);
            if (it == data_.end()) {
                return rewait(c);
            }
            w.bytes(it->second);
        }
        c.waiting = false;
        reply(c, detail::store_wire::reply_status::ok, w.buffer());
    }

    void rewait(connection& c) {
        c.missing = 0;
        for (const std::string& k : c.wait_keys) {
            if (data_.find(k) == data_.end()) {
                ++c.missing;
                watchers_[k].emplace_back(c.id, c.wait_id);
            }
        }
        c.waiting = true;
    }

    /// A get's time is up, or (`departed`) a rank left while it waited: which keys
    /// exist, then every rank's state, so that the client can say what became of the
    /// ranks it waited for (and, departed, how many ranks have left).
    void answer_missing(connection& c, bool departed = false) {
        std::vector<std::byte> payload;
        for (const std::string& k : c.wait_keys) {
            payload.push_back(std::byte{data_.count(k) != 0 ? std::uint8_t{1} : std::uint8_t{0}});
        }
        {
            std::lock_guard lock(mutex_);
            for (const rank_state s : ranks_) {
                payload.push_back(static_cast<std::byte>(s));
            }
        }
        if (departed) {
            for (int i = 0; i < 8; ++i) {
                payload.push_back(static_cast<std::byte>(departures_ >> (8 * i)));
            }
        }
        c.waiting = false;
        reply(c,
              departed ? detail::store_wire::reply_status::departed
                       : detail::store_wire::reply_status::timeout,
              payload);
    }

    /// Ranks have left: the gets that asked to hear of it are answered now.
    void tell_departures() {
        for (auto& [id, c] : connections_) {
            if (c.waiting && c.watches_departures && departures_ > c.departures_seen) {
                drop_watchers(c);
                answer_missing(c, /*departed=*/true);
                process(id, c);
            }
        }
    }

    void expire_waits() {
        const auto now = clock::now();
        for (auto& [id, c] : connections_) {
            if (c.idle_deadline <= now) {
                c.dead = true; // never said who it is, or never took its refusal
                continue;
            }
            if (c.waiting && c.deadline <= now) {
                drop_watchers(c);
                answer_missing(c);
                process(id, c);
            }
        }
    }

    /// Removes a get's entries from the watcher lists (its time ran out).
    void drop_watchers(const connection& c) {
        for (const std::string& k : c.wait_keys) {
            const auto w = watchers_.find(k);
            if (w == watchers_.end()) {
                continue;
            }
            auto& list = w->second;
            list.erase(std::remove_if(
                           list.begin(), list.end(),
                           [&](const auto& e) { return e.first == c.id && e.second == c.wait_id; }),
                       list.end());
            if (list.empty()) {
                watchers_.erase(w);
            }
        }
    }

    void reply(connection& c, detail::store_wire::reply_status status,
               std::span<const std::byte> payload) {
        detail::store_wire::writer w;
        w.u8(static_cast<std::uint8_t>(status));
        w.bytes(payload);
        c.out.insert(c.out.end(), w.buffer().begin(), w.buffer().end());
        flush(c);
    }
    void reply_text(connection& c, detail::store_wire::reply_status status, std::string_view text) {
        reply(c, status, std::as_bytes(std::span(text.data(), text.size())));
    }

    void flush(connection& c) {
        while (c.out_at < c.out.size()) {
            const ssize_t k = ::send(c.fd.get(), c.out.data() + c.out_at, c.out.size() - c.out_at,
                                     MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0) {
                c.out_at += static_cast<std::size_t>(k);
            } else if (k < 0 && errno == EINTR) {
                continue;
            } else {
                if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                    c.dead = true;
                }
                return;
            }
        }
        c.out.clear();
        c.out_at = 0;
        if (c.closing) {
            c.dead = true;
        }
    }

    /// Removes dead connections; their ranks have left, which the gets that watch
    /// for it hear at once.
    void reap() {
        const std::uint64_t before = departures_;
        for (auto it = connections_.begin(); it != connections_.end();) {
            if (!it->second.dead) {
                ++it;
                continue;
            }
            if (it->second.waiting) {
                drop_watchers(it->second);
            }
            if (it->second.greeted) {
                std::lock_guard lock(mutex_);
                ranks_[static_cast<std::size_t>(it->second.rank)] = rank_state::left;
                --connected_;
                ++departures_;
                changed_.notify_all();
            }
            it = connections_.erase(it);
        }
        if (departures_ != before) {
            tell_departures();
        }
    }

    static constexpr std::int64_t max_wait_ms = std::int64_t{365} * 24 * 3600 * 1000;

    int world_size_;
    std::chrono::milliseconds idle_limit_;
    clock::time_point listener_resumes_{};
    std::uint16_t port_ = 0;
    detail::socket_fd listener_;
    detail::socket_fd wake_read_, wake_write_;

    // Owned by the server thread.
    std::unordered_map<std::uint64_t, connection> connections_;
    std::unordered_map<std::string, std::vector<std::byte>> data_;
    std::unordered_map<std::string, std::vector<std::pair<std::uint64_t, std::uint64_t>>> watchers_;
    std::unordered_map<int, std::string> peers_;
    std::uint64_t next_id_ = 1;
    std::uint64_t next_wait_ = 1;
    std::uint64_t departures_ = 0; ///< greeted connections that have closed

    // Shared with callers, under mutex_.
    std::mutex mutex_;
    std::condition_variable changed_;
    std::vector<rank_state> ranks_;
    int connected_ = 0;
    bool stop_ = false;

    std::thread thread_; // last: starts after everything it uses
};

} // namespace unison
