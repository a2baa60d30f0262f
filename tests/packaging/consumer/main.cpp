// Smallest real use of unison from another project: an all-reduce over two threads.
#include <unison/unison.hpp>

#include <atomic>
#include <cstdio>
#include <vector>

int main() {
    std::atomic<int> errors = 0; // written by both rank threads, only on failure
    unison::thread_world(2).run([&](auto& comm) {
        std::vector<float> x(5, float(comm.rank() + 1));
        unison::all_reduce(comm, x); // in-place sum over 2 ranks -> 3
        for (float v : x) {
            if (v != 3.0f) {
                ++errors;
            }
        }
    });
    std::printf("consumer: %s\n", errors == 0 ? "ok" : "FAILED");
    return errors == 0 ? 0 : 1;
}
