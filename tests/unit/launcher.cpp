// Launcher discovery (unison/comm/launcher.hpp) on fake environments: torchrun,
// Open MPI, Slurm, their precedence, malformed values, and the choice of GPU.

#include "unison/comm/launcher.hpp"
#include "support/environment.hpp"

#include <doctest/doctest.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

namespace {

using unison::test::fake_env;

/// what() of the argument_error detect_launch throws for `env`, or "" if it returns.
std::string launch_error(const fake_env& env) {
    try {
        (void)unison::detect_launch(env);
    } catch (const unison::argument_error& e) {
        CHECK(e.rank() == -1); // no rank is known yet
        CHECK(e.operation() == "detect_launch");
        return e.what();
    }
    return "";
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

const fake_env torchrun{
    {"RANK", "5"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}};

const fake_env open_mpi{{"OMPI_COMM_WORLD_RANK", "6"},
                        {"OMPI_COMM_WORLD_SIZE", "8"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};

/// 7 tasks on 4 nodes, "2(x3),1": nodes 0-2 run 2 tasks each, node 3 runs 1.
fake_env slurm(int procid, int localid, int nodeid) {
    return {{"SLURM_PROCID", std::to_string(procid)},
            {"SLURM_LOCALID", std::to_string(localid)},
            {"SLURM_NODEID", std::to_string(nodeid)},
            {"SLURM_NTASKS", "7"},
            {"SLURM_TASKS_PER_NODE", "2(x3),1"}};
}

fake_env with(fake_env env, const std::string& name, const std::string& value) {
    env.vars[name] = value;
    return env;
}
fake_env without(fake_env env, const std::string& name) {
    env.vars.erase(name);
    return env;
}
fake_env merged(fake_env a, const fake_env& b) {
    a.vars.insert(b.vars.begin(), b.vars.end());
    return a;
}

} // namespace

TEST_CASE("launcher: no launcher means a one-rank job") {
    const unison::launch_info info = unison::detect_launch(fake_env{{"PATH", "/usr/bin"}});
    CHECK(info.rank == 0);
    CHECK(info.size == 1);
    CHECK(info.local_rank == 0);
    CHECK(info.local_size == 1);
    CHECK(info.launcher == "none");
}

TEST_CASE("launcher: torchrun") {
    const unison::launch_info info = unison::detect_launch(torchrun);
    CHECK(info.launcher == "torchrun");
    CHECK(info.rank == 5);
    CHECK(info.size == 16);
    CHECK(info.local_rank == 1);
    CHECK(info.local_size == 4);
}

TEST_CASE("launcher: Open MPI") {
    const unison::launch_info info = unison::detect_launch(open_mpi);
    CHECK(info.launcher == "openmpi");
    CHECK(info.rank == 6);
    CHECK(info.size == 8);
    CHECK(info.local_rank == 2);
    CHECK(info.local_size == 4);
}

TEST_CASE("launcher: Slurm expands SLURM_TASKS_PER_NODE for this node") {
    SUBCASE("node 1 of 2(x3),1 runs 2 tasks") {
        const unison::launch_info info = unison::detect_launch(slurm(3, 1, 1));
        CHECK(info.launcher == "slurm");
        CHECK(info.rank == 3);
        CHECK(info.size == 7);
        CHECK(info.local_rank == 1);
        CHECK(info.local_size == 2);
    }
    SUBCASE("node 3 of 2(x3),1 runs 1 task") {
        const unison::launch_info info = unison::detect_launch(slurm(6, 0, 3));
        CHECK(info.rank == 6);
        CHECK(info.local_rank == 0);
        CHECK(info.local_size == 1);
    }
    SUBCASE("node 0 of 2(x3),1 runs 2 tasks") {
        const unison::launch_info info = unison::detect_launch(slurm(0, 0, 0));
        CHECK(info.local_size == 2);
    }
    SUBCASE("a list without repeats") {
        const auto env = with(slurm(4, 0, 2), "SLURM_TASKS_PER_NODE", "3,1,1");
        CHECK(unison::detect_launch(env).local_size == 1);
    }
    SUBCASE("without SLURM_TASKS_PER_NODE every task counts as local") {
        const auto env = without(slurm(3, 1, 1), "SLURM_TASKS_PER_NODE");
        const unison::launch_info info = unison::detect_launch(env);
        CHECK(info.local_rank == 1);
        CHECK(info.local_size == 7);
    }
}

TEST_CASE("launcher: torchrun and mpirun inside a Slurm allocation win over Slurm") {
    SUBCASE("torchrun") {
        const unison::launch_info info = unison::detect_launch(merged(torchrun, slurm(0, 0, 0)));
        CHECK(info.launcher == "torchrun");
        CHECK(info.rank == 5);
        CHECK(info.size == 16);
        CHECK(info.local_rank == 1);
        CHECK(info.local_size == 4);
    }
    SUBCASE("Open MPI") {
        const unison::launch_info info = unison::detect_launch(merged(open_mpi, slurm(0, 0, 0)));
        CHECK(info.launcher == "openmpi");
        CHECK(info.rank == 6);
        CHECK(info.local_rank == 2);
    }
    SUBCASE("torchrun over Open MPI") {
        CHECK(unison::detect_launch(merged(torchrun, open_mpi)).launcher == "torchrun");
    }
}

TEST_CASE("launcher: a malformed value throws argument_error naming the variable") {
    struct example {
        fake_env env;
        const char* variable;
    };
    const example examples[] = {
        {with(torchrun, "RANK", "five"), "RANK"},
        {with(torchrun, "RANK", "-1"), "RANK"},
        {with(torchrun, "RANK", ""), "RANK"},
        {with(torchrun, "WORLD_SIZE", "16.0"), "WORLD_SIZE"},
        {with(torchrun, "WORLD_SIZE", " 16"), "WORLD_SIZE"},
        {with(torchrun, "LOCAL_RANK", "1a"), "LOCAL_RANK"},
        {with(torchrun, "LOCAL_WORLD_SIZE", "0x4"), "LOCAL_WORLD_SIZE"},
        {with(open_mpi, "OMPI_COMM_WORLD_RANK", "abc"), "OMPI_COMM_WORLD_RANK"},
        {with(open_mpi, "OMPI_COMM_WORLD_LOCAL_SIZE", "+4"), "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {with(slurm(3, 1, 1), "SLURM_NTASKS", "seven"), "SLURM_NTASKS"},
        {with(slurm(3, 1, 1), "SLURM_NODEID", "n1"), "SLURM_NODEID"},
        {with(slurm(3, 1, 1), "SLURM_TASKS_PER_NODE", "2(x3"), "SLURM_TASKS_PER_NODE"},
        {with(slurm(3, 1, 1), "SLURM_TASKS_PER_NODE", "2(xthree)"), "SLURM_TASKS_PER_NODE"},
        {with(slurm(3, 1, 1), "SLURM_TASKS_PER_NODE", "two"), "SLURM_TASKS_PER_NODE"},
        // Node 4 does not exist in 2(x3),1.
        {with(slurm(6, 0, 4), "SLURM_TASKS_PER_NODE", "2(x3),1"), "SLURM_TASKS_PER_NODE"},
    };
    for (const example& e : examples) {
        const std::string what = launch_error(e.env);
        INFO("variable ", std::string(e.variable), ": ", what);
        CHECK(contains(what, "unison: detect_launch: "));
        CHECK(contains(what, e.variable));
    }
}

TEST_CASE("launcher: a missing partner variable throws argument_error naming it") {
    struct example {
        fake_env env;
        const char* variable;
    };
    const example examples[] = {
        {without(open_mpi, "OMPI_COMM_WORLD_SIZE"), "OMPI_COMM_WORLD_SIZE"},
        {without(open_mpi, "OMPI_COMM_WORLD_LOCAL_RANK"), "OMPI_COMM_WORLD_LOCAL_RANK"},
        {without(slurm(3, 1, 1), "SLURM_NTASKS"), "SLURM_NTASKS"},
        {without(slurm(3, 1, 1), "SLURM_LOCALID"), "SLURM_LOCALID"},
    };
    for (const example& e : examples) {
        const std::string what = launch_error(e.env);
        INFO("variable ", std::string(e.variable), ": ", what);
        CHECK(contains(what, e.variable));
    }
}

TEST_CASE("launcher: inconsistent values throw argument_error") {
    const fake_env examples[] = {
        with(torchrun, "RANK", "16"),                            // rank == size
        with(torchrun, "WORLD_SIZE", "0"),                       // empty job
        with(torchrun, "LOCAL_RANK", "4"),                       // local rank == local size
        with(torchrun, "LOCAL_WORLD_SIZE", "32"),                // more local than global ranks
        with(open_mpi, "OMPI_COMM_WORLD_RANK", "9"),             // rank > size
        with(open_mpi, "OMPI_COMM_WORLD_LOCAL_RANK", "4"),       // local rank == local size
        slurm(7, 0, 3),                                          // rank == size
        slurm(6, 1, 3),                                          // node 3 runs 1 task only
        with(slurm(3, 1, 1), "SLURM_TASKS_PER_NODE", "8(x3),1"), // 8 local > 7 tasks
    };
    for (const fake_env& env : examples) {
        const std::string what = launch_error(env);
        INFO(what);
        CHECK(contains(what, "unison: detect_launch: "));
    }
}

// launcher.hpp promises: "Throws argument_error naming the variable when one is set
// but malformed or inconsistent".
TEST_CASE("launcher: inconsistent values name the variables involved") {
    struct example {
        fake_env env;
        std::initializer_list<const char*> variables;
    };
    const example examples[] = {
        {with(torchrun, "RANK", "16"), {"RANK", "WORLD_SIZE"}},
        {with(torchrun, "LOCAL_RANK", "4"), {"LOCAL_RANK", "LOCAL_WORLD_SIZE"}},
        {with(open_mpi, "OMPI_COMM_WORLD_RANK", "9"),
         {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}},
        {with(open_mpi, "OMPI_COMM_WORLD_LOCAL_RANK", "4"),
         {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}},
        {slurm(7, 0, 3), {"SLURM_PROCID", "SLURM_NTASKS"}},
        {slurm(6, 1, 3), {"SLURM_LOCALID", "SLURM_TASKS_PER_NODE"}},
    };
    for (const example& e : examples) {
        const std::string what = launch_error(e.env);
        for (const char* variable : e.variables) {
            INFO("variable ", std::string(variable), ": ", what);
            CHECK(contains(what, variable));
        }
    }
}

TEST_CASE("launcher: local_device picks the GPU by local rank") {
    unison::launch_info info;
    info.rank = 9;
    info.size = 16;
    info.local_rank = 1;
    info.local_size = 8;
    CHECK(unison::local_device(info, 8) == 1); // never the global rank 9

    info.local_rank = 7;
    CHECK(unison::local_device(info, 8) == 7);

    info.local_rank = 8;
    info.local_size = 16;
    try {
        (void)unison::local_device(info, 8);
        FAIL("local rank 8 with 8 GPUs must throw");
    } catch (const unison::argument_error& e) {
        INFO(std::string(e.what()));
        CHECK(e.rank() == 9);
        CHECK(e.operation() == "local_device");
        CHECK(contains(e.what(), "local rank 8"));
    }

    info.local_rank = 0;
    CHECK_THROWS_AS((void)unison::local_device(info, 0), unison::argument_error);
}

TEST_CASE("launcher: MVAPICH2 and the PMI launchers of MPICH, Intel MPI and Cray PALS") {
    SUBCASE("MVAPICH2") {
        const unison::launch_info info =
            unison::detect_launch(fake_env{{"MV2_COMM_WORLD_RANK", "3"},
                                           {"MV2_COMM_WORLD_SIZE", "8"},
                                           {"MV2_COMM_WORLD_LOCAL_RANK", "1"},
                                           {"MV2_COMM_WORLD_LOCAL_SIZE", "2"}});
        CHECK(info.launcher == "mvapich");
        CHECK(info.rank == 3);
        CHECK(info.size == 8);
        CHECK(info.local_rank == 1);
        CHECK(info.local_size == 2);
        CHECK(info.local_from_launcher);
    }
    SUBCASE("MPICH's Hydra and Intel MPI: PMI_RANK with MPI_LOCALRANKID") {
        const unison::launch_info info = unison::detect_launch(fake_env{{"PMI_RANK", "5"},
                                                                        {"PMI_SIZE", "6"},
                                                                        {"MPI_LOCALRANKID", "2"},
                                                                        {"MPI_LOCALNRANKS", "3"}});
        CHECK(info.launcher == "pmi");
        CHECK(info.rank == 5);
        CHECK(info.size == 6);
        CHECK(info.local_rank == 2);
        CHECK(info.local_size == 3);
        CHECK(info.local_from_launcher);
    }
    SUBCASE("Cray PALS: PMI_RANK with PALS_LOCAL_RANKID") {
        const unison::launch_info info = unison::detect_launch(
            fake_env{{"PMI_RANK", "9"}, {"PMI_SIZE", "16"}, {"PALS_LOCAL_RANKID", "1"}});
        CHECK(info.launcher == "pmi");
        CHECK(info.local_rank == 1);
        CHECK(info.local_from_launcher);
    }
    SUBCASE("PMI_RANK alone: the local rank is unknown (mpi_launch asks MPI)") {
        const unison::launch_info info =
            unison::detect_launch(fake_env{{"PMI_RANK", "4"}, {"PMI_SIZE", "6"}});
        CHECK(info.launcher == "pmi");
        CHECK(info.rank == 4);
        CHECK(info.local_rank == 0);
        CHECK(info.local_size == 1);
        CHECK_FALSE(info.local_from_launcher);
    }
    SUBCASE("RANK and WORLD_SIZE alone (Kubernetes): the local rank is unknown "
            "(store_launch takes it from the host names)") {
        const unison::launch_info info =
            unison::detect_launch(fake_env{{"RANK", "3"}, {"WORLD_SIZE", "8"}});
        CHECK(info.launcher == "torchrun");
        CHECK(info.rank == 3);
        CHECK(info.local_rank == 0);
        CHECK(info.local_size == 1);
        CHECK_FALSE(info.local_from_launcher);
    }
    SUBCASE("Slurm's own variables win over PMI's under srun") {
        const auto env = merged(slurm(3, 1, 1), fake_env{{"PMI_RANK", "3"}, {"PMI_SIZE", "7"}});
        CHECK(unison::detect_launch(env).launcher == "slurm");
    }
    SUBCASE("malformed") {
        CHECK(contains(launch_error(fake_env{{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}}),
                       "PMI_RANK='x' is not a non-negative integer"));
        CHECK(contains(launch_error(fake_env{{"PMI_RANK", "1"}}), "pmi is set up but PMI_SIZE"));
        CHECK(contains(launch_error(fake_env{{"PMI_RANK", "2"}, {"PMI_SIZE", "2"}}),
                       "PMI_RANK=2 is out of range for PMI_SIZE=2"));
    }
}

TEST_CASE("launcher: a launcher whose job MPI does not share is an error naming it") {
    using unison::detail::check_launch_matches;
    // torchrun started 2 processes, each of which called MPI_Init alone
    const unison::launch_info two =
        unison::detect_launch(fake_env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
    try {
        check_launch_matches(two, 0, 1, "mpi_environment");
        FAIL("no error");
    } catch (const unison::argument_error& e) {
        const std::string what = e.what();
        CHECK(contains(what, "torchrun started this process as rank 1 of 2, but MPI_COMM_WORLD "
                             "has 1 process"));
        CHECK(contains(what, "mpirun -n 2"));
        CHECK(e.operation() == "mpi_environment");
    }
    // another launcher's variables left in the environment of an mpirun job
    CHECK_THROWS_WITH_AS(check_launch_matches(two, 3, 4, "mpi_environment"),
                         doctest::Contains("another launcher's variables"), unison::argument_error);
    // agreeing launchers, and no launcher at all, pass
    CHECK_NOTHROW(check_launch_matches(two, 1, 2, "mpi_environment"));
    CHECK_NOTHROW(check_launch_matches(unison::launch_info{}, 2, 4, "mpi_environment"));
}
