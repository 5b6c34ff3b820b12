// Small helpers shared by the googletest files.
#pragma once

#include "muon_opt.h"

#include <cstring>
#include <string>
#include <vector>

inline std::string last_error() { return muon_last_error_message(); }

inline muon_config_t default_config() {
    muon_config_t cfg;
    muon_config_init(&cfg);
    return cfg;
}

inline muon_param_desc_t make_desc(const char *name, std::vector<int64_t> shape) {
    muon_param_desc_t d;
    muon_param_desc_init(&d);
    d.name = name;
    d.ndim = static_cast<uint32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
    return d;
}

// Step args with struct_size set and no overrides of the config (muon::step_args of
// muon_opt.hpp, for the tests of the C header alone).
inline muon_step_args_t make_step_args(float lr, float weight_decay, float adam_lr, float adam_weight_decay) {
    muon_step_args_t a;
    std::memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.lr = lr;
    a.weight_decay = weight_decay;
    a.adam_lr = adam_lr;
    a.adam_weight_decay = adam_weight_decay;
    return a;
}

inline std::vector<muon_comm_t *> make_host_group(uint32_t n) {
    std::vector<muon_comm_t *> comms(n, nullptr);
    if (muon_host_group_create(n, comms.data()) != MUON_STATUS_SUCCESS) comms.clear();
    return comms;
}

inline size_t numel(const std::vector<int64_t> &shape) {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
}

// Deterministic value in [-1, 1) (splitmix-style), shared by the tests' data generators.
inline float noise(uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ 0xD1B54A32D192ED03ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return static_cast<float>(x >> 40) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
}

inline float bf16_to_float(uint16_t bits) {
    uint32_t word = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &word, sizeof f);
    return f;
}
