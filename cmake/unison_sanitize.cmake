# Sanitizer flags for the code unison builds itself (tests, benchmarks, examples,
# the header test). They are directory options, so they reach every target created
# after the call in the calling directory and its subdirectories, and never a
# project that merely consumes unison.

include_guard(GLOBAL)

# unison_enable_sanitizer(<kind>)
#   ""        nothing
#   address   AddressSanitizer + UndefinedBehaviorSanitizer; any UB report aborts
#   thread    ThreadSanitizer
function(unison_enable_sanitizer kind)
    if(kind STREQUAL "")
        return()
    elseif(kind STREQUAL "address")
        set(flags -fsanitize=address -fsanitize=undefined -fno-sanitize-recover=all)
    elseif(kind STREQUAL "thread")
        set(flags -fsanitize=thread)
    else()
        message(FATAL_ERROR
            "UNISON_SANITIZE is \"${kind}\"; use \"\", \"address\" (ASan+UBSan) or \"thread\"")
    endif()
    if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
        message(FATAL_ERROR
            "UNISON_SANITIZE needs GCC or Clang, not ${CMAKE_CXX_COMPILER_ID}")
    endif()
    # Readable stacks in the reports.
    list(APPEND flags -fno-omit-frame-pointer)

    foreach(flag IN LISTS flags)
        # nvcc does not know these flags; it hands them to the host compiler.
        add_compile_options(
            $<$<COMPILE_LANGUAGE:CXX>:${flag}>
            $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${flag}>)
        # HOST_LINK: the final link runs the host compiler even for CUDA targets,
        # while a CUDA device-link step (nvcc -dlink) must not see these flags.
        add_link_options($<HOST_LINK:${flag}>)
    endforeach()
    message(STATUS "unison: building tests, benchmarks and examples with ${flags}")
endfunction()
