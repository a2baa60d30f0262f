#pragma once

/// \file
/// The store's wire format. Integers are little-endian whatever the host's order, so
/// ranks on different machines agree.
///
///   hello   client -> server   u32 magic, u32 version, i32 rank, i32 world size,
///                              u64 pid, bytes host name
///   welcome server -> client   u8 status (0 ok, else refused), bytes message
///   request client -> server   u64 length of the rest, then u8 op, u32 key count,
///                              keys (bytes each), bytes value, i64 argument
///   reply   server -> client   u8 status, bytes payload
///
/// where "bytes" is a u64 length and the bytes. One request is outstanding per
/// connection: the client sends the next only after the reply.
///
/// A get's value is empty, or a u64: how many ranks the client knows to have left.
/// With it the server answers `departed` as soon as more ranks than that have left
/// (at once, if they already have), so that a client waiting for a rank that died
/// hears of it from the broken connection instead of at its timeout.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace unison::detail::store_wire {

inline constexpr std::uint32_t magic = 0x52534e55; // "UNSR"
inline constexpr std::uint32_t version = 3;        // 3: rank_state::refused

/// Limits that keep a stray client (a port scanner, another program's protocol) from
/// making the server allocate without bound.
inline constexpr std::uint64_t max_key_bytes = 4096;
inline constexpr std::uint64_t max_keys = 1u << 20;
inline constexpr std::uint64_t max_value_bytes = std::uint64_t{1} << 30;
inline constexpr std::uint64_t max_host_bytes = 1024;

enum class op : std::uint8_t {
    set = 1,   ///< keys[0] = value
    get = 2,   ///< waits until every key exists (argument: milliseconds), then their values
    add = 3,   ///< keys[0] += argument (a 64-bit counter); returns the new value
    erase = 4, ///< removes every key
};

enum class reply_status : std::uint8_t {
    ok = 0,
    timeout = 1, ///< payload: one byte per key, 1 where it exists; one rank_state per rank
    refused = 2, ///< payload: why
    /// A rank left while a get waited (one that asked to hear of it): timeout's
    /// payload, then a u64, the number of ranks that have left.
    departed = 3,
};

/// A rank as the server sees it. `refused`: a process came as this rank and was
/// refused (another WORLD_SIZE or protocol version), and none has joined as it since.
enum class rank_state : std::uint8_t { absent = 0, connected = 1, left = 2, refused = 3 };

/// Appends little-endian integers and length-prefixed bytes.
class writer {
public:
    void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
    void u32(std::uint32_t v) { put(v, 4); }
    void u64(std::uint64_t v) { put(v, 8); }
    void i64(std::int64_t v) { put(static_cast<std::uint64_t>(v), 8); }
    void bytes(const void* data, std::size_t size) {
        u64(size);
        const auto* p = static_cast<const std::byte*>(data);
        out_.insert(out_.end(), p, p + size);
    }
    void bytes(std::string_view s) { bytes(s.data(), s.size()); }
    void bytes(std::span<const std::byte> s) { bytes(s.data(), s.size()); }

    std::vector<std::byte>& buffer() noexcept { return out_; }

private:
    void put(std::uint64_t v, int n) {
        for (int i = 0; i < n; ++i) {
            out_.push_back(static_cast<std::byte>(v >> (8 * i)));
        }
    }
    std::vector<std::byte> out_;
};

/// Reads what `writer` wrote from a buffer that may hold only part of a message:
/// each read returns false, consuming nothing useful, when the buffer ends first
/// (`complete()` stays false) or a length exceeds `limit` (`too_large()`).
class reader {
public:
    explicit reader(std::span<const std::byte> in) : in_(in) {}

    bool u8(std::uint8_t& v) {
        if (!need(1)) {
            return false;
        }
        v = static_cast<std::uint8_t>(in_[at_++]);
        return true;
    }
    bool u32(std::uint32_t& v) {
        std::uint64_t w = 0;
        if (!get(w, 4)) {
            return false;
        }
        v = static_cast<std::uint32_t>(w);
        return true;
    }
    bool u64(std::uint64_t& v) { return get(v, 8); }
    bool i64(std::int64_t& v) {
        std::uint64_t w = 0;
        if (!get(w, 8)) {
            return false;
        }
        v = static_cast<std::int64_t>(w);
        return true;
    }
    /// Length-prefixed bytes of at most `limit`.
    bool bytes(std::span<const std::byte>& v, std::uint64_t limit) {
        std::uint64_t n = 0;
        if (!u64(n)) {
            return false;
        }
        if (n > limit) {
            too_large_ = true;
            return false;
        }
        if (!need(static_cast<std::size_t>(n))) {
            return false;
        }
        v = in_.subspan(at_, static_cast<std::size_t>(n));
        at_ += static_cast<std::size_t>(n);
        return true;
    }
    bool string(std::string& v, std::uint64_t limit) {
        std::span<const std::byte> b;
        if (!bytes(b, limit)) {
            return false;
        }
        v.assign(reinterpret_cast<const char*>(b.data()), b.size());
        return true;
    }

    /// Bytes read so far.
    std::size_t consumed() const noexcept { return at_; }
    bool too_large() const noexcept { return too_large_; }

private:
    bool need(std::size_t n) const { return in_.size() - at_ >= n; }
    bool get(std::uint64_t& v, int n) {
        if (!need(static_cast<std::size_t>(n))) {
            return false;
        }
        v = 0;
        for (int i = 0; i < n; ++i) {
            v |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(in_[at_ + i])) << (8 * i);
        }
        at_ += static_cast<std::size_t>(n);
        return true;
    }

    std::span<const std::byte> in_;
    std::size_t at_ = 0;
    bool too_large_ = false;
};

/// A parsed request.
struct request {
    op operation = op::set;
    std::vector<std::string> keys;
    std::vector<std::byte> value;
    std::int64_t argument = 0;
};

/// The most a request may hold after its length: every key and value at their limit
/// would be absurd, so the frame is bounded on its own.
inline constexpr std::uint64_t max_request_bytes = max_value_bytes + (std::uint64_t{64} << 20);

/// Parses one request from the front of `in`. Returns the bytes it took, 0 when `in`
/// holds only part of one (known from its length prefix, so a partial request costs
/// nothing to look at again); `malformed` is set when it can never parse (a limit
/// exceeded, an unknown operation, a body that does not fill its frame exactly).
inline std::size_t parse_request(std::span<const std::byte> in, request& r, bool& malformed) {
    reader head(in);
    std::uint64_t length = 0;
    if (!head.u64(length)) {
        return 0;
    }
    if (length > max_request_bytes) {
        malformed = true;
        return 0;
    }
    if (in.size() - head.consumed() < length) {
        return 0;
    }
    reader rd(in.subspan(head.consumed(), static_cast<std::size_t>(length)));
    std::uint8_t o = 0;
    std::uint32_t count = 0;
    if (!rd.u8(o) || !rd.u32(count) || o < static_cast<std::uint8_t>(op::set) ||
        o > static_cast<std::uint8_t>(op::erase) || count > max_keys) {
        malformed = true;
        return 0;
    }
    r.operation = static_cast<op>(o);
    r.keys.clear();
    for (std::uint32_t k = 0; k < count; ++k) {
        std::string key;
        if (!rd.string(key, max_key_bytes)) {
            malformed = true;
            return 0;
        }
        r.keys.push_back(std::move(key));
    }
    std::span<const std::byte> value;
    if (!rd.bytes(value, max_value_bytes) || !rd.i64(r.argument) || rd.consumed() != length) {
        malformed = true;
        return 0;
    }
    r.value.assign(value.begin(), value.end());
    return head.consumed() + static_cast<std::size_t>(length);
}

/// A parsed hello.
struct hello {
    std::uint32_t version = 0;
    std::int32_t rank = -1;
    std::int32_t world_size = 0;
    std::uint64_t pid = 0;
    std::string host;
};

/// As parse_request, for the hello; `malformed` also when the magic is not ours.
inline std::size_t parse_hello(std::span<const std::byte> in, hello& h, bool& malformed) {
    reader rd(in);
    std::uint32_t m = 0;
    if (!rd.u32(m)) {
        return 0;
    }
    if (m != magic) {
        malformed = true;
        return 0;
    }
    std::uint32_t rank = 0, size = 0;
    if (!rd.u32(h.version) || !rd.u32(rank) || !rd.u32(size) || !rd.u64(h.pid)) {
        return 0;
    }
    h.rank = static_cast<std::int32_t>(rank);
    h.world_size = static_cast<std::int32_t>(size);
    if (!rd.string(h.host, max_host_bytes)) {
        malformed = rd.too_large();
        return 0;
    }
    return rd.consumed();
}

} // namespace unison::detail::store_wire
