// Config defaults and validation through the header.
#include "muon_opt.hpp"
#include "muon_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

TEST(Config, MacroAndInitAgreeFieldByField) {
    muon_config_t a = MUON_CONFIG_INIT;
    muon_config_t b = default_config();
    EXPECT_EQ(a.struct_size, b.struct_size);
    EXPECT_EQ(a.abi_version, b.abi_version);
    EXPECT_EQ(a.bucket_size, b.bucket_size);
    EXPECT_EQ(a.muon_layout, b.muon_layout);
    EXPECT_EQ(a.overlap_grad_reduce, b.overlap_grad_reduce);
    EXPECT_EQ(a.overlap_param_gather, b.overlap_param_gather);
    EXPECT_EQ(a.grad_dtype, b.grad_dtype);
    EXPECT_EQ(a.muon_momentum, b.muon_momentum);
    EXPECT_EQ(a.muon_nesterov, b.muon_nesterov);
    EXPECT_EQ(a.muon_coefficient_set, b.muon_coefficient_set);
    EXPECT_EQ(a.muon_num_ns_steps, b.muon_num_ns_steps);
    EXPECT_EQ(a.muon_ns_precision, b.muon_ns_precision);
    EXPECT_EQ(a.muon_scale_mode, b.muon_scale_mode);
    EXPECT_EQ(a.muon_extra_scale_factor, b.muon_extra_scale_factor);
    EXPECT_EQ(a.adam_beta1, b.adam_beta1);
    EXPECT_EQ(a.adam_beta2, b.adam_beta2);
    EXPECT_EQ(a.adam_eps, b.adam_eps);
    EXPECT_EQ(a.clip_grad, b.clip_grad);
    EXPECT_EQ(a.mxfp8_param_gather, b.mxfp8_param_gather);
    EXPECT_EQ(a.mxfp8_swizzled_scales, b.mxfp8_swizzled_scales);
    EXPECT_EQ(a.vocab_size, b.vocab_size);
    EXPECT_EQ(a.collective_timeout_ms, b.collective_timeout_ms);
    EXPECT_EQ(a.host_comm_mode, b.host_comm_mode);
    EXPECT_EQ(a.host_threads, b.host_threads);
    EXPECT_EQ(a.muon_tp_mode, b.muon_tp_mode);
    EXPECT_EQ(a.muon_ns_eps, b.muon_ns_eps);
    EXPECT_EQ(a.reserved, b.reserved);
    EXPECT_EQ(a.muon_ns_method, b.muon_ns_method);
    EXPECT_EQ(a.muon_ns_method, MUON_NS_METHOD_STANDARD);
    EXPECT_EQ(a.reserved2, b.reserved2);
    EXPECT_EQ(a.muon_ownership, b.muon_ownership);
    EXPECT_EQ(a.muon_ownership, MUON_OWNERSHIP_AUTO);
    EXPECT_EQ(a.reserved3, b.reserved3);
    EXPECT_EQ(a.weight_decay_rule, b.weight_decay_rule);
    EXPECT_EQ(a.weight_decay_rule, MUON_WEIGHT_DECAY_RULE_MEGATRON);
    EXPECT_EQ(a.muon_tp_mode, MUON_TP_MODE_DUPLICATED);
    for (const auto &pair : {std::make_pair(a.network, b.network), std::make_pair(a.expert_network, b.expert_network)}) {
        EXPECT_EQ(pair.first.declared, 0u);
        EXPECT_EQ(pair.first.declared, pair.second.declared);
        EXPECT_EQ(pair.first.hop_latency_us, pair.second.hop_latency_us);
        EXPECT_EQ(pair.first.bus_bandwidth_gbps, pair.second.bus_bandwidth_gbps);
    }
    EXPECT_EQ(a.muon_variant, b.muon_variant);
    EXPECT_EQ(a.muon_variant, MUON_VARIANT_STANDARD);
    EXPECT_EQ(a.adaptive_muon_beta2, b.adaptive_muon_beta2);
    EXPECT_EQ(a.adaptive_muon_eps, b.adaptive_muon_eps);
    EXPECT_EQ(a.adaptive_muon_beta2, 0.95f);
    EXPECT_EQ(a.adaptive_muon_eps, 1e-8f);
    EXPECT_EQ(a.reserved4, b.reserved4);
    EXPECT_EQ(a.param_sharding, b.param_sharding);
    EXPECT_EQ(a.param_sharding, MUON_PARAM_SHARDING_REPLICATED);
    EXPECT_EQ(a.reshard_after_forward, b.reshard_after_forward);
    EXPECT_EQ(a.reshard_after_forward, 1u);
    EXPECT_EQ(a.param_prefetch_buckets, b.param_prefetch_buckets);
    EXPECT_EQ(a.param_prefetch_buckets, 1u);
    EXPECT_EQ(a.reserved5, b.reserved5);
    EXPECT_EQ(a.muon_custom_coefficient_steps, b.muon_custom_coefficient_steps);
    EXPECT_EQ(a.muon_custom_coefficient_steps, 0u);
    for (size_t i = 0; i < 3 * MUON_MAX_CUSTOM_COEFFICIENTS; ++i) {
        EXPECT_EQ(a.muon_custom_coefficients[i], b.muon_custom_coefficients[i]);
        EXPECT_EQ(a.muon_custom_coefficients[i], 0.0f);
    }
    EXPECT_EQ(a.reserved6, b.reserved6);
    EXPECT_EQ(a.cautious_weight_decay, b.cautious_weight_decay);
    EXPECT_EQ(a.cautious_weight_decay, 0u);
    EXPECT_EQ(a.muon_momentum_dtype, b.muon_momentum_dtype);
    EXPECT_EQ(a.muon_momentum_dtype, static_cast<uint32_t>(MUON_DTYPE_F32));
}

TEST(Config, ACustomTableOfTheQuinticTriplesIsQuinticCyclic) {
    std::vector<float> in(16 * 48), cyclic(in.size()), custom(in.size());
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
    muon_config_t cfg = default_config();
    cfg.muon_num_ns_steps = 7;
    cfg.muon_coefficient_set = MUON_COEFFICIENTS_QUINTIC_CYCLIC;
    ASSERT_EQ(muon_newton_schulz_host_config(in.data(), cyclic.data(), 16, 48, &cfg), MUON_STATUS_SUCCESS) << last_error();
    muon::set_custom_coefficients(cfg, {{4.0848f, -6.8946f, 2.9270f},
                                        {3.9505f, -6.3029f, 2.6377f},
                                        {3.7418f, -5.5913f, 2.3037f},
                                        {2.8769f, -3.1427f, 1.2046f},
                                        {2.8366f, -3.0525f, 1.2012f}});
    ASSERT_EQ(muon_newton_schulz_host_config(in.data(), custom.data(), 16, 48, &cfg), MUON_STATUS_SUCCESS) << last_error();
    EXPECT_EQ(std::memcmp(cyclic.data(), custom.data(), in.size() * sizeof(float)), 0);
    EXPECT_THROW(muon::set_custom_coefficients(cfg, {}), muon::Error);
}

TEST(Config, ADeclaredNetworkValidatesAndAnOlderStructSizeIgnoresIt) {
    muon_config_t cfg = default_config();
    cfg.network = muon::network(14.0, 45.0);
    cfg.expert_network = muon::network(3.4, 360.0);
    EXPECT_EQ(muon_config_validate(&cfg), MUON_STATUS_SUCCESS) << last_error();
    cfg.network.bus_bandwidth_gbps = 0.0;
    EXPECT_EQ(muon_config_validate(&cfg), MUON_STATUS_OUT_OF_RANGE);
    // A caller compiled against the 144-byte header never declares a network.
    cfg.struct_size = 144;
    EXPECT_EQ(muon_config_validate(&cfg), MUON_STATUS_SUCCESS) << last_error();
}

struct BadField {
    const char *field;
    std::function<void(muon_config_t &)> edit;
    muon_status_t status;
};

class ConfigRejects : public ::testing::TestWithParam<BadField> {};

TEST_P(ConfigRejects, NamesTheField) {
    muon_config_t cfg = default_config();
    GetParam().edit(cfg);
    EXPECT_EQ(muon_config_validate(&cfg), GetParam().status);
    EXPECT_NE(last_error().find(GetParam().field), std::string::npos) << last_error();
}

INSTANTIATE_TEST_SUITE_P(
    EveryRule, ConfigRejects,
    ::testing::Values(
        BadField{"muon_layout", [](muon_config_t &c) { c.muon_layout = MUON_LAYOUT_COMPACT_ROOTED + 1; }, MUON_STATUS_INVALID_ENUM_VALUE},
        BadField{"grad_dtype", [](muon_config_t &c) { c.grad_dtype = 5; }, MUON_STATUS_INVALID_ENUM_VALUE},
        BadField{"muon_momentum", [](muon_config_t &c) { c.muon_momentum = 1.0f; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"muon_num_ns_steps", [](muon_config_t &c) { c.muon_num_ns_steps = 0; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"adam_eps", [](muon_config_t &c) { c.adam_eps = -1.0f; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"clip_grad", [](muon_config_t &c) { c.clip_grad = -2.0f; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"muon_nesterov", [](muon_config_t &c) { c.muon_nesterov = 7; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"host_threads", [](muon_config_t &c) { c.host_threads = 1025; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"muon_tp_mode", [](muon_config_t &c) { c.muon_tp_mode = 3; }, MUON_STATUS_INVALID_ENUM_VALUE},
        BadField{"muon_ns_eps", [](muon_config_t &c) { c.muon_ns_eps = 0.0f; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"muon_ns_method", [](muon_config_t &c) { c.muon_ns_method = MUON_NS_METHOD_GRAM + 1; }, MUON_STATUS_INVALID_ENUM_VALUE},
        BadField{"muon_ownership", [](muon_config_t &c) { c.muon_ownership = MUON_OWNERSHIP_AUTO + 1; }, MUON_STATUS_INVALID_ENUM_VALUE},
        BadField{"weight_decay_rule", [](muon_config_t &c) { c.weight_decay_rule = MUON_WEIGHT_DECAY_RULE_FLAGGED + 1; }, MUON_STATUS_INVALID_ENUM_VALUE},
        BadField{"muon_variant", [](muon_config_t &c) { c.muon_variant = MUON_VARIANT_ADAMUON + 1; }, MUON_STATUS_INVALID_ENUM_VALUE},
        BadField{"adaptive_muon_beta2", [](muon_config_t &c) { c.adaptive_muon_beta2 = 1.0f; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"adaptive_muon_eps", [](muon_config_t &c) { c.adaptive_muon_eps = 0.0f; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"param_sharding", [](muon_config_t &c) { c.param_sharding = MUON_PARAM_SHARDING_SHARDED + 1; }, MUON_STATUS_INVALID_ENUM_VALUE},
        BadField{"reshard_after_forward", [](muon_config_t &c) { c.reshard_after_forward = 2; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"param_sharding", [](muon_config_t &c) {
            c.param_sharding = MUON_PARAM_SHARDING_SHARDED;
            c.overlap_param_gather = 0;
        }, MUON_STATUS_INCOMPATIBLE_OPTIONS},
        BadField{"param_sharding", [](muon_config_t &c) {
            c.param_sharding = MUON_PARAM_SHARDING_SHARDED;
            c.overlap_grad_reduce = 0;
        }, MUON_STATUS_INCOMPATIBLE_OPTIONS},
        BadField{"muon_ownership", [](muon_config_t &c) {
            c.muon_layout = MUON_LAYOUT_PADDED;
            c.muon_ownership = MUON_OWNERSHIP_CONTIGUOUS;
        }, MUON_STATUS_INCOMPATIBLE_OPTIONS},
        BadField{"network.hop_latency_us", [](muon_config_t &c) { c.network = muon::network(-1.0, 45.0); }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"network.bus_bandwidth_gbps", [](muon_config_t &c) { c.network = muon::network(14.0, 0.0); }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"expert_network.bus_bandwidth_gbps", [](muon_config_t &c) {
            c.expert_network = muon::network(3.4, -360.0);
        }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"network.declared", [](muon_config_t &c) {
            c.network = muon::network(14.0, 45.0);
            c.network.declared = 2;
        }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"muon_coefficient_set", [](muon_config_t &c) { c.muon_coefficient_set = MUON_COEFFICIENTS_CUSTOM + 1; }, MUON_STATUS_INVALID_ENUM_VALUE},
        BadField{"muon_num_ns_steps", [](muon_config_t &c) {
            c.muon_coefficient_set = MUON_COEFFICIENTS_CUBIC5;
            c.muon_num_ns_steps = 6;
        }, MUON_STATUS_INCOMPATIBLE_OPTIONS},
        BadField{"muon_custom_coefficients", [](muon_config_t &c) { c.muon_coefficient_set = MUON_COEFFICIENTS_CUSTOM; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"muon_custom_coefficient_steps", [](muon_config_t &c) {
            c.muon_coefficient_set = MUON_COEFFICIENTS_CUSTOM;
            c.muon_custom_coefficient_steps = MUON_MAX_CUSTOM_COEFFICIENTS + 1;
        }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"muon_custom_coefficients[1].c", [](muon_config_t &c) {
            c.muon_coefficient_set = MUON_COEFFICIENTS_CUSTOM;
            c.muon_custom_coefficient_steps = 2;
            c.muon_custom_coefficients[5] = INFINITY;
        }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"muon_custom_coefficients", [](muon_config_t &c) { c.muon_custom_coefficient_steps = 1; }, MUON_STATUS_INCOMPATIBLE_OPTIONS},
        BadField{"cautious_weight_decay", [](muon_config_t &c) { c.cautious_weight_decay = 2; }, MUON_STATUS_OUT_OF_RANGE},
        BadField{"muon_momentum_dtype", [](muon_config_t &c) { c.muon_momentum_dtype = MUON_DTYPE_BF16 + 1; }, MUON_STATUS_INVALID_ENUM_VALUE},
        BadField{"abi_version", [](muon_config_t &c) { c.abi_version = 990000; }, MUON_STATUS_ABI_MISMATCH}));
