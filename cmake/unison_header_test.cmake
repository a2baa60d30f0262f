# Header self-containment test: every public header must compile on its own, in a
# translation unit that includes nothing else, and must survive being included
# twice. A header that leans on something its includer happened to include first
# fails here instead of in a user's build.

include_guard(GLOBAL)

set(_unison_header_test_template "${CMAKE_CURRENT_LIST_DIR}/header_test.cpp.in")

# unison_add_header_test(<target> INCLUDE_DIR <dir>)
#
# Generates one .cpp per header under <dir>/unison (*.hpp) and compiles each with
# the component target that header needs; <target> (part of `all`) depends on all
# of them. Which component a header needs follows from its path:
#
#   .../mpi/... or mpi.hpp            unison::mpi    (skipped without target unison_mpi)
#   .../gloo/... or gloo.hpp          unison::gloo   (skipped without target unison_gloo)
#   .../nccl/... or nccl.hpp          unison::nccl   (skipped without target unison_nccl)
#   .../cuda/..., .../kernels/...,
#     or cuda.hpp                     unison::cuda   (skipped without target unison_cuda)
#   eigen.hpp                         unison::eigen  (skipped without target unison_eigen)
#   .../torch/... or torch.hpp        unison::torch  (skipped without target unison_torch)
#   anything else                     unison::unison alone
#
# .cuh headers need nvcc and are not compiled here. unison/unison.hpp is compiled
# twice when any component was built: once with the core target alone and once
# with every component, since it may pull in backends when their UNISON_WITH_*
# macro is set.
#
# Each group is its own object library because link dependencies (and with them
# the UNISON_WITH_* definitions and include paths) are per target: compiling a core
# header next to MPI's include path would hide a stray #include <mpi.h>.
function(unison_add_header_test target)
    cmake_parse_arguments(PARSE_ARGV 1 arg "" "INCLUDE_DIR" "")
    if(NOT arg_INCLUDE_DIR)
        message(FATAL_ERROR "unison_add_header_test: INCLUDE_DIR is required")
    endif()

    # CONFIGURE_DEPENDS: headers are added often; the build re-runs CMake when the
    # set of files changes so a new header is tested without a manual reconfigure.
    file(GLOB_RECURSE headers CONFIGURE_DEPENDS
        RELATIVE "${arg_INCLUDE_DIR}"
        "${arg_INCLUDE_DIR}/unison/*.hpp")
    list(SORT headers)

    # group -> what it links; a group whose requirement is missing is skipped.
    set(group_names core)
    set(group_core_links unison)
    foreach(component IN ITEMS mpi gloo cuda nccl eigen torch)
        if(TARGET unison_${component})
            list(APPEND group_names ${component})
            set(group_${component}_links unison_${component})
        endif()
    endforeach()
    set(group_all_links unison)
    foreach(component IN ITEMS mpi gloo cuda nccl eigen torch)
        if(TARGET unison_${component})
            list(APPEND group_all_links unison_${component})
        endif()
    endforeach()
    if(NOT group_all_links STREQUAL "unison")
        list(APPEND group_names all)
    endif()

    set(skipped)
    foreach(header IN LISTS headers)
        get_filename_component(name "${header}" NAME)
        if(header MATCHES "/nccl/" OR name STREQUAL "nccl.hpp")
            set(group nccl)
        elseif(header MATCHES "/mpi/" OR name STREQUAL "mpi.hpp")
            set(group mpi)
        elseif(header MATCHES "/gloo/" OR name STREQUAL "gloo.hpp")
            set(group gloo)
        elseif(header MATCHES "/(cuda|kernels)/" OR name STREQUAL "cuda.hpp")
            set(group cuda)
        elseif(name STREQUAL "eigen.hpp")
            set(group eigen)
        elseif(header MATCHES "/torch/" OR name STREQUAL "torch.hpp")
            set(group torch)
        else()
            set(group core)
        endif()

        set(groups_of_header ${group})
        if(header STREQUAL "unison/unison.hpp" AND "all" IN_LIST group_names)
            list(APPEND groups_of_header all)
        endif()
        foreach(group IN LISTS groups_of_header)
            if(NOT group IN_LIST group_names)
                list(APPEND skipped "${header} (needs ${group})")
                continue()
            endif()
            set(UNISON_HEADER_TEST_HEADER "${header}")
            set(source "${CMAKE_CURRENT_BINARY_DIR}/${target}/${group}/${header}.cpp")
            configure_file("${_unison_header_test_template}" "${source}" @ONLY)
            list(APPEND group_${group}_sources "${source}")
        endforeach()
    endforeach()

    add_custom_target(${target} ALL)
    foreach(group IN LISTS group_names)
        if(NOT group_${group}_sources)
            continue()
        endif()
        set(group_target ${target}-${group})
        add_library(${group_target} OBJECT ${group_${group}_sources})
        target_link_libraries(${group_target} PRIVATE ${group_${group}_links})
        # A warning in a public header is a warning in every user's build.
        target_compile_options(${group_target} PRIVATE
            $<$<CXX_COMPILER_ID:GNU,Clang,AppleClang>:-Wall -Wextra -Wpedantic -Werror>
            $<$<CXX_COMPILER_ID:MSVC>:/W4 /WX>)
        add_dependencies(${target} ${group_target})
        list(LENGTH group_${group}_sources count)
        message(STATUS "unison header test: ${count} header(s) with ${group}")
    endforeach()
    if(skipped)
        list(JOIN skipped ", " skipped)
        message(STATUS "unison header test: skipped ${skipped}")
    endif()
endfunction()
