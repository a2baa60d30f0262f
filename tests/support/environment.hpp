#pragma once

// Test helpers for code that reads the process environment or opens sockets: a fake
// environment to pass where std::getenv would be called, and a free loopback port.

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace unison::test {

/// A process environment as a map; looked up like std::getenv.
struct fake_env {
    std::map<std::string, std::string, std::less<>> vars;

    fake_env(std::initializer_list<std::pair<const std::string, std::string>> v) : vars(v) {}

    const char* operator()(const char* name) const {
        const auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    }
};

/// A loopback port that nothing listens on: bound, read and released (another
/// program may take it in the moment after; callers that bind it retry).
inline std::uint16_t unused_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t n = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    ::close(fd);
    return ntohs(a.sin_port);
}

} // namespace unison::test
