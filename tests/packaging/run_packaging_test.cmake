# Builds and runs consumer/ against unison obtained in one way.
#
#   cmake -DMODE=find_package|pkg_config|examples_alone|add_subdirectory|fetchcontent
#         -DSOURCE_DIR=<unison source tree> -DWORK_DIR=<scratch directory>
#         [-DGENERATOR=<generator>] [-DMAKE_PROGRAM=<path>] [-DCXX_COMPILER=<path>]
#         [-DCXX_FLAGS_RELEASE=<flags>]
#         [-DENABLE_MPI=ON|OFF] [-DENABLE_CUDA=ON|OFF] [-DENABLE_NCCL=ON|OFF]
#         [-DMPIEXEC=<the build's mpiexec>]
#         -P run_packaging_test.cmake
#
# find_package: configure, build and install unison (its tests, benchmarks and
# examples off) into WORK_DIR/prefix, then build the consumer against that prefix.
# pkg_config: the same install, moved elsewhere (the .pc files must find it from
# where they lie), then consumer/main.cpp and the README's "Use" program compiled
# by hand with the flags `pkg-config --cflags --libs unison` gives, under
# -Wall -Wextra -Wpedantic -Werror, and run; with MPI the Use program again with
# unison-mpi's flags, run on 2 processes (MPIEXEC); with NCCL compiled and linked
# with unison-nccl's.
# examples_alone: the same install, then each of examples/average_gradients,
# ddp_mlp and zero_adamw copied on its own into WORK_DIR (as a user copies one),
# configured against the prefix, built and trained on two threads.
# add_subdirectory, fetchcontent: build the consumer straight from SOURCE_DIR.
# Then run the consumer through its ctest. ENABLE_MPI=ON also links unison::mpi.
# WORK_DIR is emptied first: a stale cache would hide a broken configure.
cmake_minimum_required(VERSION 3.21)

foreach(required IN ITEMS MODE SOURCE_DIR WORK_DIR)
    if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
        message(FATAL_ERROR "run_packaging_test.cmake: -D${required}=... is required")
    endif()
endforeach()
if(NOT MODE MATCHES "^(find_package|pkg_config|examples_alone|add_subdirectory|fetchcontent)$")
    message(FATAL_ERROR "run_packaging_test.cmake: unknown MODE '${MODE}'")
endif()

set(config Release)
set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/consumer-build")

# Arguments every configure step shares.
set(configure_args "-DCMAKE_BUILD_TYPE=${config}")
if(GENERATOR)
    list(APPEND configure_args -G "${GENERATOR}")
endif()
if(MAKE_PROGRAM)
    list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER)
    list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(CXX_FLAGS_RELEASE)
    list(APPEND configure_args "-DCMAKE_CXX_FLAGS_RELEASE=${CXX_FLAGS_RELEASE}")
endif()
# For the configure that builds unison itself: the install, or the consumer's
# in-tree copy.
set(backend_args)
foreach(backend IN ITEMS MPI CUDA NCCL)
    if(DEFINED ENABLE_${backend})
        list(APPEND backend_args "-DUNISON_ENABLE_${backend}=${ENABLE_${backend}}")
    endif()
endforeach()
set(with_mpi OFF)
if(ENABLE_MPI)
    set(with_mpi ON)
endif()

# Runs one step; on failure stops with the step's command line and output.
function(run_step name)
    message(STATUS "[${MODE}] ${name}")
    execute_process(COMMAND ${ARGN}
        RESULT_VARIABLE result
        OUTPUT_VARIABLE output
        ERROR_VARIABLE output)
    if(NOT result EQUAL 0)
        list(JOIN ARGN " " command)
        message(FATAL_ERROR
            "[${MODE}] ${name} failed (${result})\n"
            "command: ${command}\n"
            "output:\n${output}")
    endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(consumer_args
    "-DUNISON_CONSUMER_MODE=${MODE}"
    "-DUNISON_CONSUMER_WITH_MPI=${with_mpi}")

if(MODE MATCHES "^(find_package|pkg_config|examples_alone)$")
    set(unison_build "${WORK_DIR}/unison-build")
    run_step("configure unison"
        "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${unison_build}" ${configure_args}
        ${backend_args} "-DCMAKE_INSTALL_PREFIX=${prefix}"
        -DUNISON_BUILD_TESTS=OFF -DUNISON_BUILD_BENCH=OFF -DUNISON_BUILD_EXAMPLES=OFF)
    run_step("build unison" "${CMAKE_COMMAND}" --build "${unison_build}" --config ${config})
    run_step("install unison" "${CMAKE_COMMAND}" --install "${unison_build}" --config ${config})
    list(APPEND consumer_args "-DCMAKE_PREFIX_PATH=${prefix}")
    if(MODE STREQUAL "examples_alone")
        foreach(example IN ITEMS average_gradients ddp_mlp zero_adamw)
            set(copy "${WORK_DIR}/${example}")
            file(COPY "${SOURCE_DIR}/examples/${example}" DESTINATION "${WORK_DIR}")
            run_step("configure ${example} alone" "${CMAKE_COMMAND}" -S "${copy}"
                -B "${copy}/build" ${configure_args} "-DCMAKE_PREFIX_PATH=${prefix}")
            run_step("build ${example} alone" "${CMAKE_COMMAND}" --build "${copy}/build"
                --config ${config})
            set(args -t 2)
            if(NOT example STREQUAL "average_gradients")
                list(APPEND args --steps 60 --log-every 60) # long enough to learn
            endif()
            run_step("run ${example} alone" "${copy}/build/${example}" ${args})
        endforeach()
        message(STATUS "[${MODE}] ok")
        return()
    endif()
    if(MODE STREQUAL "pkg_config")
        # Moved after installing: nothing may point at the install prefix.
        set(moved "${WORK_DIR}/moved")
        file(RENAME "${prefix}" "${moved}")
        find_program(pkg_config_program pkg-config REQUIRED)
        set(ENV{PKG_CONFIG_PATH} "${moved}/share/pkgconfig")
        execute_process(COMMAND "${pkg_config_program}" --modversion unison
            OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE result)
        if(NOT result EQUAL 0 OR NOT version MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+$")
            message(FATAL_ERROR "[${MODE}] pkg-config --modversion unison: '${version}'")
        endif()
        # The README's "Use" program, as written.
        file(READ "${SOURCE_DIR}/README.md" readme)
        string(FIND "${readme}" "<!-- test: readme_use" at)
        if(at EQUAL -1)
            message(FATAL_ERROR "[${MODE}] README.md has no block marked <!-- test: readme_use")
        endif()
        string(SUBSTRING "${readme}" ${at} -1 rest)
        string(FIND "${rest}" "```cpp\n" open)
        math(EXPR open "${open} + 7")
        string(SUBSTRING "${rest}" ${open} -1 rest)
        string(FIND "${rest}" "\n```" close)
        string(SUBSTRING "${rest}" 0 ${close} code)
        file(WRITE "${WORK_DIR}/readme_use.cpp" "${code}\n")

        set(compiler "${CXX_COMPILER}")
        if(NOT compiler)
            set(compiler c++)
        endif()
        set(strict -Wall -Wextra -Wpedantic -Werror)
        # Compiles `source` into WORK_DIR/<name> with the flags of pkg-config `module`.
        function(compile_with module source name)
            execute_process(COMMAND "${pkg_config_program}" --cflags --libs ${module}
                OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE result)
            if(NOT result EQUAL 0)
                message(FATAL_ERROR "[${MODE}] pkg-config --cflags --libs ${module} failed")
            endif()
            string(FIND "${flags}" "${prefix}" stale)
            if(NOT stale EQUAL -1)
                message(FATAL_ERROR "[${MODE}] ${module}.pc names the install prefix ${prefix} "
                                    "after the install was moved: ${flags}")
            endif()
            separate_arguments(flags UNIX_COMMAND "${flags}")
            run_step("compile ${name} with ${module}'s flags (${version})" "${compiler}"
                ${strict} "${source}" -o "${WORK_DIR}/${name}" ${flags})
        endfunction()
        compile_with(unison "${CMAKE_CURRENT_LIST_DIR}/consumer/main.cpp" consumer)
        run_step("run consumer" "${WORK_DIR}/consumer")
        compile_with(unison "${WORK_DIR}/readme_use.cpp" readme_use)
        run_step("run the README's Use program" "${WORK_DIR}/readme_use")
        if(ENABLE_MPI)
            compile_with(unison-mpi "${WORK_DIR}/readme_use.cpp" readme_use_mpi)
            if(MPIEXEC)
                set(ENV{UNISON_MPIEXEC} "${MPIEXEC}")
            endif()
            run_step("run the README's Use program on 2 MPI processes"
                bash "${SOURCE_DIR}/scripts/mpiexec.sh" -n 2 "${WORK_DIR}/readme_use_mpi")
        endif()
        if(ENABLE_NCCL)
            compile_with(unison-nccl "${WORK_DIR}/readme_use.cpp" readme_use_nccl)
        endif()
        message(STATUS "[${MODE}] ok")
        return()
    endif()
else()
    list(APPEND consumer_args "-DUNISON_SOURCE_DIR=${SOURCE_DIR}" ${backend_args})
endif()

run_step("configure consumer"
    "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${consumer_build}"
    ${configure_args} ${consumer_args})

if(MODE STREQUAL "find_package")
    # The consumer must have used the fresh install, not some other unison.
    file(STRINGS "${consumer_build}/CMakeCache.txt" unison_dir REGEX "^unison_DIR:")
    string(REGEX REPLACE "^unison_DIR:[A-Z]+=" "" unison_dir "${unison_dir}")
    cmake_path(IS_PREFIX prefix "${unison_dir}" NORMALIZE from_prefix)
    if(NOT from_prefix)
        message(FATAL_ERROR "[${MODE}] consumer found unison in '${unison_dir}', not in ${prefix}")
    endif()
endif()

run_step("build consumer" "${CMAKE_COMMAND}" --build "${consumer_build}" --config ${config})
run_step("run consumer"
    "${CMAKE_CTEST_COMMAND}" --test-dir "${consumer_build}" -C ${config} --output-on-failure)
message(STATUS "[${MODE}] ok")
