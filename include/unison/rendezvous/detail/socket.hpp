#pragma once

/// \file
/// POSIX TCP sockets for the store: an owning descriptor, a listening socket on every
/// interface, a connect that retries until a deadline (the hosting rank may start
/// later than the others), and sends and receives bounded by a deadline. Sockets are
/// non-blocking; every wait is a poll() with the time left, so nothing here can block
/// past its deadline (name resolution aside: getaddrinfo has its own resolver
/// timeouts).

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace unison::detail {

using store_clock = std::chrono::steady_clock;

/// Milliseconds from now until `deadline`, clamped to [0, INT_MAX] for poll().
inline int millis_until(store_clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - store_clock::now());
    if (left.count() <= 0) {
        return 0;
    }
    return static_cast<int>(std::min<long long>(left.count() + 1, INT_MAX));
}

/// The text of an errno value (thread-safe, unlike strerror).
inline std::string errno_text(int e) {
    return std::system_category().message(e);
}

/// An owned file descriptor, closed on destruction.
class socket_fd {
public:
    socket_fd() = default;
    explicit socket_fd(int fd) noexcept : fd_(fd) {}
    socket_fd(socket_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    socket_fd& operator=(socket_fd&& o) noexcept {
        if (this != &o) {
            reset(std::exchange(o.fd_, -1));
        }
        return *this;
    }
    socket_fd(const socket_fd&) = delete;
    socket_fd& operator=(const socket_fd&) = delete;
    ~socket_fd() { reset(); }

    int get() const noexcept { return fd_; }
    explicit operator bool() const noexcept { return fd_ >= 0; }
    void reset(int fd = -1) noexcept {
        if (fd_ >= 0) {
            ::close(fd_);
        }
        fd_ = fd;
    }

private:
    int fd_ = -1;
};

inline bool set_nonblocking(int fd) {
    const int flags = ::fcntl(fd, F_GETFL, 0);
    return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

/// Small request-reply messages: send them now, not after Nagle's delay.
inline void set_nodelay(int fd) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// How a bounded transfer ended.
enum class io_status { ok, timeout, closed, failed };

struct io_result {
    io_status status = io_status::ok;
    int error = 0; ///< errno, for failed
};

/// Waits until `fd` is ready for `events` or `deadline` passes.
inline io_result wait_ready(int fd, short events, store_clock::time_point deadline) {
    for (;;) {
        pollfd p{fd, events, 0};
        const int n = ::poll(&p, 1, millis_until(deadline));
        if (n > 0) {
            return {};
        }
        if (n == 0) {
            return {io_status::timeout, 0};
        }
        if (errno != EINTR) {
            return {io_status::failed, errno};
        }
    }
}

/// Sends all `size` bytes before `deadline`.
inline io_result send_all(int fd, const void* data, std::size_t size,
                          store_clock::time_point deadline) {
    auto p = static_cast<const char*>(data);
    while (size > 0) {
        const ssize_t k = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            size -= static_cast<std::size_t>(k);
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (const io_result r = wait_ready(fd, POLLOUT, deadline); r.status != io_status::ok) {
                return r;
            }
            continue;
        }
        if (k < 0 && errno == EINTR) {
            continue;
        }
        const int e = k < 0 ? errno : EPIPE;
        return {e == EPIPE || e == ECONNRESET ? io_status::closed : io_status::failed, e};
    }
    return {};
}

/// Receives exactly `size` bytes before `deadline`.
inline io_result recv_all(int fd, void* data, std::size_t size, store_clock::time_point deadline) {
    auto p = static_cast<char*>(data);
    while (size > 0) {
        const ssize_t k = ::recv(fd, p, size, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            size -= static_cast<std::size_t>(k);
            continue;
        }
        if (k == 0) {
            return {io_status::closed, 0};
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (const io_result r = wait_ready(fd, POLLIN, deadline); r.status != io_status::ok) {
                return r;
            }
            continue;
        }
        if (errno == EINTR) {
            continue;
        }
        return {errno == ECONNRESET ? io_status::closed : io_status::failed, errno};
    }
    return {};
}

/// Listens on `port` (0: any free port) of every interface: IPv6 with IPv4-mapped
/// addresses where the host has IPv6, else IPv4. On failure returns an empty socket
/// and says why in `error`. `bound_port` receives the port actually bound.
inline socket_fd listen_tcp(std::uint16_t port, std::uint16_t& bound_port, std::string& error) {
    for (const int family : {AF_INET6, AF_INET}) {
        socket_fd s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (!s) {
            error = "socket(): " + errno_text(errno);
            continue;
        }
        int one = 1;
        // A job restarted at once finds its port in TIME_WAIT: take it anyway.
        ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_storage address{};
        socklen_t length = 0;
        if (family == AF_INET6) {
            int zero = 0;
            ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            auto* a = reinterpret_cast<sockaddr_in6*>(&address);
            a->sin6_family = AF_INET6;
            a->sin6_addr = in6addr_any;
            a->sin6_port = htons(port);
            length = sizeof(sockaddr_in6);
        } else {
            auto* a = reinterpret_cast<sockaddr_in*>(&address);
            a->sin_family = AF_INET;
            a->sin_addr.s_addr = htonl(INADDR_ANY);
            a->sin_port = htons(port);
            length = sizeof(sockaddr_in);
        }
        if (::bind(s.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
            const int e = errno;
            error = "cannot listen on port " + std::to_string(port) + ": " + errno_text(e);
            if (e == EADDRINUSE || e == EACCES) {
                return {}; // the same on IPv4: say so now
            }
            continue;
        }
        if (::listen(s.get(), SOMAXCONN) != 0 || !set_nonblocking(s.get())) {
            error = "listen(): " + errno_text(errno);
            continue;
        }
        length = sizeof address;
        ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&address), &length);
        bound_port = ntohs(address.ss_family == AF_INET6
                               ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                               : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
        return s;
    }
    return {};
}

/// Connects to `host`:`port`, retrying (the host may resolve late, the listener may
/// not be up yet) until `deadline`. Returns an empty socket on failure, with the
/// last reason in `error`.
inline socket_fd connect_tcp(const std::string& host, std::uint16_t port,
                             store_clock::time_point deadline, std::string& error) {
    auto backoff = std::chrono::milliseconds(10);
    const std::string service = std::to_string(port);
    for (;;) {
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        addrinfo* found = nullptr;
        const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
        if (gai != 0) {
            error = "cannot resolve '" + host + "': " + ::gai_strerror(gai);
        }
        for (addrinfo* a = gai == 0 ? found : nullptr; a != nullptr; a = a->ai_next) {
            socket_fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
            if (!s || !set_nonblocking(s.get())) {
                error = "socket(): " + errno_text(errno);
                continue;
            }
            int e = 0;
            if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
                e = errno;
                if (e == EINPROGRESS) {
                    const io_result r = wait_ready(s.get(), POLLOUT, deadline);
                    socklen_t length = sizeof e;
                    if (r.status == io_status::ok) {
                        e = 0;
                        ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &e, &length);
                    } else {
                        e = r.status == io_status::timeout ? ETIMEDOUT : r.error;
                    }
                }
            }
            if (e == 0) {
                ::freeaddrinfo(found);
                set_nodelay(s.get());
                return s;
            }
            error = "cannot connect to " + host + ":" + service + ": " + errno_text(e);
        }
        if (found != nullptr) {
            ::freeaddrinfo(found);
        }
        const auto now = store_clock::now();
        if (now >= deadline) {
            return {};
        }
        std::this_thread::sleep_for(std::min<store_clock::duration>(backoff, deadline - now));
        backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
}

} // namespace unison::detail
