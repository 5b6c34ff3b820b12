// Small helpers shared by the googletest files.
#pragma once

#include "muon_opt.h"

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

inline std::vector<muon_comm_t *> make_host_group(uint32_t n) {
    std::vector<muon_comm_t *> comms(n, nullptr);
    if (muon_host_group_create(n, comms.data()) != MUON_STATUS_SUCCESS) comms.clear();
    return comms;
}
