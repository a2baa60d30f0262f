// The host half of the mixed translation-unit test: compiled by the host compiler,
// it drives a ddp and an fsdp engine that device_side.cu constructed (and, in the
// GPU cases, put on the device there), through the same class definitions.

#include "engines.hpp"

namespace mixed {

bool ddp_sync(ddp_type& dp, std::size_t gradients) {
    for (std::size_t g = gradients; g-- > 0;) {
        dp.mark_ready(g);
    }
    return dp.finish();
}

double fsdp_step(fsdp_type& engine, const std::vector<unison::unit_handle>& units,
                 const gradient_writer& write) {
    for (const unison::unit_handle& u : units) {
        auto scope = engine.forward(u);
        (void)engine.value(u[0]);
    }
    for (auto u = units.rbegin(); u != units.rend(); ++u) {
        auto scope = engine.backward(*u);
        for (std::size_t j = 0; j < u->size(); ++j) {
            write(u->index(), j, engine.gradient((*u)[j]));
        }
    }
    return engine.step().grad_norm;
}

std::vector<std::vector<float>> fsdp_values(fsdp_type& engine,
                                            const std::vector<unison::unit_handle>& units,
                                            const value_reader& read) {
    std::vector<std::vector<float>> out;
    for (const unison::unit_handle& u : units) {
        auto scope = engine.forward(u);
        for (std::size_t j = 0; j < u.size(); ++j) {
            out.push_back(read(engine.value(u[j])));
        }
    }
    return out;
}

} // namespace mixed
