#pragma once

/// \file
/// Throws when an MPI call a benchmark makes itself (a raw-MPI baseline, the
/// control plane of its runs) fails, with MPI's own words for the error.

#include <mpi.h>

#include <stdexcept>
#include <string>

namespace unison::bench {

inline void check_mpi(int rc, const char* what) {
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING] = {};
        int len = 0;
        MPI_Error_string(rc, text, &len);
        throw std::runtime_error(std::string(what) + " failed: " + text);
    }
}

} // namespace unison::bench
