#pragma once

// Runs a case on thread worlds of 1 to 4 ranks (from `from` on), one after another.

#include <unison/thread.hpp>

#include <doctest/doctest.h>

namespace unison::test {

template <class Fn>
void on_worlds(Fn fn, int from = 1) {
    for (int ranks = from; ranks <= 4; ++ranks) {
        CAPTURE(ranks);
        thread_world(ranks).run([&](thread_communicator& comm) { fn(comm); });
    }
}

} // namespace unison::test
