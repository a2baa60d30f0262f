// expect: use of deleted function
#include <unison/sharded.hpp>
#include <unison/thread.hpp>

#include <vector>

using namespace unison;
void f(fsdp<thread_communicator>& engine) {
    // the vector would be gone before add_unit reads it
    fsdp<thread_communicator>::parameter p("w", std::vector<float>(10, 1.0f));
    (void)engine.add_unit({p});
}
