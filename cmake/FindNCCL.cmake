# FindNCCL
# --------
#
# Finds the NVIDIA Collective Communications Library.
#
# Imported target:
#   NCCL::NCCL          the NCCL shared library with its include directory
#
# Result variables:
#   NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIRS, NCCL_LIBRARIES
#
# Cache variables (set them to force a particular NCCL):
#   NCCL_INCLUDE_DIR, NCCL_LIBRARY
#
# Search order:
#   1. NCCL_ROOT (CMake variable or environment variable), which find_path and
#      find_library search first by CMake's own rule (policy CMP0074);
#   2. NCCL_HOME (CMake variable or environment variable), the name NVIDIA's
#      nccl-tests use;
#   3. the CUDA toolkit, when find_package(CUDAToolkit) ran before this module
#      (recent toolkits and the NGC containers ship NCCL inside it);
#   4. the system paths.
# An explicitly named NCCL wins over the one bundled with the toolkit.

include(FindPackageHandleStandardArgs)

set(_nccl_hints)
foreach(_nccl_dir IN ITEMS "${NCCL_HOME}" "$ENV{NCCL_HOME}")
    if(_nccl_dir)
        list(APPEND _nccl_hints "${_nccl_dir}")
    endif()
endforeach()

find_path(NCCL_INCLUDE_DIR
    NAMES nccl.h
    HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
    PATH_SUFFIXES include
    DOC "Directory holding nccl.h")

find_library(NCCL_LIBRARY
    NAMES nccl
    HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
    PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu
    DOC "The NCCL library")

unset(_nccl_dir)
unset(_nccl_hints)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
    file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
        REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
    foreach(_nccl_part IN ITEMS MAJOR MINOR PATCH)
        string(REGEX MATCH "NCCL_${_nccl_part}[ \t]+([0-9]+)" _nccl_match "${_nccl_version_lines}")
        set(NCCL_VERSION_${_nccl_part} "${CMAKE_MATCH_1}")
    endforeach()
    if(NOT NCCL_VERSION_MAJOR STREQUAL "")
        set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
    endif()
    unset(_nccl_version_lines)
    unset(_nccl_part)
    unset(_nccl_match)
endif()

find_package_handle_standard_args(NCCL
    REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
    VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND)
    set(NCCL_INCLUDE_DIRS "${NCCL_INCLUDE_DIR}")
    set(NCCL_LIBRARIES "${NCCL_LIBRARY}")
    if(NOT TARGET NCCL::NCCL)
        # UNKNOWN rather than SHARED: NCCL_LIBRARY may name libnccl_static.a.
        add_library(NCCL::NCCL UNKNOWN IMPORTED)
        set_target_properties(NCCL::NCCL PROPERTIES
            IMPORTED_LOCATION "${NCCL_LIBRARY}"
            INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    endif()
endif()

mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
