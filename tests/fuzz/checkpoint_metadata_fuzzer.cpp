// libFuzzer entry point for the checkpoint metadata parser (unison/checkpoint/format.hpp):
// every input must give a checkpoint_error or metadata that validates and round-trips.
// Not part of the CMake build. Build and run from the repository root with
//   clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -I include \
//       tests/fuzz/checkpoint_metadata_fuzzer.cpp -o checkpoint_metadata_fuzzer
//   ./checkpoint_metadata_fuzzer -max_len=4096 corpus/
// (seed corpus/ with a few files written by unison::checkpoint::serialize).

#include "unison/checkpoint/format.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace ck = unison::checkpoint;
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const ck::metadata m = ck::parse(text, "fuzz");
        ck::validate(m, "fuzz");
        if (ck::parse(ck::serialize(m), "fuzz") != m) {
            std::abort(); // accepted metadata must read back equal
        }
    } catch (const unison::checkpoint_error&) {
        // rejected with a message: fine
    }
    return 0;
}
