// The version is defined once (include/unison/version.hpp); the string and the
// number are derived from its three parts, and CMake reads the same parts.

#include <unison/core.hpp>

#include <doctest/doctest.h>

#include <string>

TEST_CASE("version: the string, the number and the parts agree") {
    const std::string parts = std::to_string(UNISON_VERSION_MAJOR) + "." +
                              std::to_string(UNISON_VERSION_MINOR) + "." +
                              std::to_string(UNISON_VERSION_PATCH);
    CHECK(std::string(unison::version_string) == parts);
    CHECK(UNISON_VERSION ==
          UNISON_VERSION_MAJOR * 10000 + UNISON_VERSION_MINOR * 100 + UNISON_VERSION_PATCH);
#ifdef UNISON_TEST_PROJECT_VERSION
    CHECK(parts == UNISON_TEST_PROJECT_VERSION); // CMake's project version
#endif
}
