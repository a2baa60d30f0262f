#pragma once

/// \file
/// What a benchmark run under mpiexec needs besides unison: the job around it
/// (MPI_Init to MPI_Finalize, an error on one rank ending the job) and a check of
/// the MPI calls it makes itself.

#include <unison/mpi.hpp>

#include <mpi.h>

#include <exception>
#include <stdexcept>
#include <string>

namespace unison::bench {

/// Runs `fn()` between MPI_Init and MPI_Finalize and returns its exit status. An
/// error on one rank ends the job with "`program`: what" (mpi_environment::abort_job,
/// which gives the launcher time to forward it; exit status 75 for a timeout), since
/// the other ranks would wait for that rank forever.
template <class Fn>
int run_mpi_job(const char* program, int& argc, char**& argv, Fn&& fn) {
    mpi_environment env(argc, argv);
    try {
        return fn();
    } catch (const std::exception& e) {
        mpi_environment::abort_job(program, e);
    }
}

/// Throws when an MPI call the benchmark makes itself (a raw-MPI baseline, the
/// control plane of its runs) fails, with MPI's own words for the error.
inline void check_mpi(int rc, const char* what) {
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING] = {};
        int len = 0;
        MPI_Error_string(rc, text, &len);
        throw std::runtime_error(std::string(what) + " failed: " + text);
    }
}

} // namespace unison::bench
