#pragma once

/// \file
/// unison's version, defined here and nowhere else: CMake reads its project version
/// (and so the package's and the pkg-config file's) from these three lines.
/// Semantic versioning; before 1.0 a minor version may change the API (CHANGELOG.md
/// says what changed).

#define UNISON_VERSION_MAJOR 0
#define UNISON_VERSION_MINOR 2
#define UNISON_VERSION_PATCH 0

/// MAJOR * 10000 + MINOR * 100 + PATCH, for `#if UNISON_VERSION >= 200` and the like.
#define UNISON_VERSION                                                                             \
    (UNISON_VERSION_MAJOR * 10000 + UNISON_VERSION_MINOR * 100 + UNISON_VERSION_PATCH)

#define UNISON_VERSION_STRINGIFY_(x) #x
#define UNISON_VERSION_STRINGIFY(x) UNISON_VERSION_STRINGIFY_(x)

namespace unison {

/// "MAJOR.MINOR.PATCH".
inline constexpr const char* version_string =
    UNISON_VERSION_STRINGIFY(UNISON_VERSION_MAJOR) "." UNISON_VERSION_STRINGIFY(
        UNISON_VERSION_MINOR) "." UNISON_VERSION_STRINGIFY(UNISON_VERSION_PATCH);

} // namespace unison
