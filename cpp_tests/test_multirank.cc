// 4 host ranks on std::thread through the C header, against a 1-rank run fed the rank-order
// sum of the 4 ranks' gradients: params must be bitwise equal on every rank after every step.
#include "muon_opt.hpp"
#include "muon_test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace {

struct Param {
    const char *name;
    std::vector<int64_t> shape;
    uint32_t flags;
};

const std::vector<Param> kModel = {
    {"embedding.weight", {40, 32}, MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT},
    {"layers.0.fc1.weight", {64, 32}, 0},
    {"layers.0.fc1.bias", {64}, 0},
    {"layers.0.fc2.weight", {32, 64}, 0},
    {"layers.1.fc1.weight", {64, 32}, 0},
    {"output.weight", {40, 32}, MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT},
};
constexpr int kSteps = 5;
constexpr int kRanks = 4;

float rank_grad(int step, int rank, size_t p, size_t i, float w) {
    return noise((uint64_t(step) << 40) ^ (uint64_t(rank) << 32) ^ (uint64_t(p) << 20) ^ i) * 0.01f + 0.05f * w;
}

// Trains on one rank of a group; `ranks_summed` > 1 makes a 1-rank run use the rank-order
// sum of that many ranks' gradients, scaled by 1/ranks. Returns the param bits after every step.
std::vector<std::vector<uint16_t>> train_rank(muon_comm_t *comm, int rank, int ranks_summed) {
    muon_config_t cfg = default_config();
    cfg.clip_grad = 0.0f;
    cfg.muon_ns_precision = MUON_NS_PRECISION_F32;
    cfg.bucket_size = 4096;
    muon_optimizer_t *opt = nullptr;
    EXPECT_EQ(muon_optimizer_create(&cfg, comm, nullptr, &opt), MUON_STATUS_SUCCESS) << last_error();
    std::vector<std::vector<float>> init(kModel.size());
    for (size_t p = 0; p < kModel.size(); ++p) {
        muon_param_desc_t d = make_desc(kModel[p].name, kModel[p].shape);
        d.flags = kModel[p].flags;
        init[p].resize(numel(kModel[p].shape));
        for (size_t i = 0; i < init[p].size(); ++i) init[p][i] = 0.1f * noise(1000000 * p + i);
        d.init_data = init[p].data();
        d.init_dtype = MUON_DTYPE_F32;
        EXPECT_EQ(muon_optimizer_add_param(opt, &d, nullptr), MUON_STATUS_SUCCESS) << last_error();
    }
    EXPECT_EQ(muon_optimizer_finalize(opt), MUON_STATUS_SUCCESS) << last_error();
    std::vector<muon_param_view_t> views(kModel.size());
    for (size_t p = 0; p < kModel.size(); ++p) {
        views[p].struct_size = sizeof(muon_param_view_t);
        EXPECT_EQ(muon_optimizer_param_view(opt, static_cast<uint32_t>(p), &views[p]), MUON_STATUS_SUCCESS);
    }
    std::vector<std::vector<uint16_t>> history;
    for (int step = 0; step < kSteps; ++step) {
        EXPECT_EQ(muon_optimizer_zero_grad(opt), MUON_STATUS_SUCCESS) << last_error();
        for (size_t p = kModel.size(); p-- > 0;) {
            EXPECT_EQ(muon_optimizer_wait_params(opt, views[p].bucket), MUON_STATUS_SUCCESS);
            auto *w = static_cast<const uint16_t *>(views[p].data);
            auto *g = static_cast<float *>(views[p].grad);
            for (size_t i = 0; i < numel(kModel[p].shape); ++i) {
                float weight = bf16_to_float(w[i]);
                if (ranks_summed > 1) {
                    float sum = 0.0f, scale = 1.0f / static_cast<float>(ranks_summed);
                    for (int r = 0; r < ranks_summed; ++r) sum += rank_grad(step, r, p, i, weight);
                    g[i] = sum * scale;  // the library scales the summed gradient by clip/dp
                } else {
                    g[i] = rank_grad(step, rank, p, i, weight);
                }
            }
            EXPECT_EQ(muon_optimizer_grad_ready(opt, static_cast<uint32_t>(p)), MUON_STATUS_SUCCESS) << last_error();
        }
        muon_step_args_t args = make_step_args(0.02f, 0.1f, 0.003f, 0.01f);
        muon_step_info_t info{};
        info.struct_size = sizeof info;
        EXPECT_EQ(muon_optimizer_step(opt, &args, &info), MUON_STATUS_SUCCESS) << last_error();
        EXPECT_EQ(info.skipped, 0u);
        EXPECT_EQ(info.step, static_cast<uint64_t>(step + 1));
        std::vector<uint16_t> bits;
        for (size_t p = 0; p < kModel.size(); ++p) {
            EXPECT_EQ(muon_optimizer_wait_params(opt, views[p].bucket), MUON_STATUS_SUCCESS);
            auto *w = static_cast<const uint16_t *>(views[p].data);
            bits.insert(bits.end(), w, w + numel(kModel[p].shape));
        }
        history.push_back(bits);
    }
    EXPECT_EQ(muon_optimizer_destroy(opt), MUON_STATUS_SUCCESS);
    return history;
}

}  // namespace

TEST(MultiRank, FourThreadRanksMatchOneRankBitwise) {
    auto single = make_host_group(1);
    ASSERT_EQ(single.size(), 1u);
    auto reference = train_rank(single[0], 0, kRanks);
    EXPECT_EQ(muon_comm_destroy(single[0]), MUON_STATUS_SUCCESS);
    ASSERT_NE(reference.front(), reference.back()) << "training must change the params";

    auto comms = make_host_group(kRanks);
    ASSERT_EQ(comms.size(), static_cast<size_t>(kRanks));
    std::vector<std::vector<std::vector<uint16_t>>> results(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) threads.emplace_back([&, r] { results[r] = train_rank(comms[r], r, 1); });
    for (auto &t : threads) t.join();
    for (auto *c : comms) EXPECT_EQ(muon_comm_destroy(c), MUON_STATUS_SUCCESS);
    for (int r = 0; r < kRanks; ++r) {
        ASSERT_EQ(results[r].size(), reference.size());
        for (size_t s = 0; s < reference.size(); ++s) EXPECT_EQ(results[r][s], reference[s]) << "rank " << r << " step " << s;
    }
}

TEST(MultiRank, NewtonSchulzReferenceUtility) {
    std::vector<float> in(16 * 48), out(16 * 48, 0.0f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = noise(i);
    ASSERT_EQ(muon_newton_schulz_host(in.data(), out.data(), 16, 48, MUON_COEFFICIENTS_SIMPLE, 5, MUON_NS_PRECISION_F32),
              MUON_STATUS_SUCCESS)
        << last_error();
    double diag = 0.0;  // X·Xᵀ of an orthogonalized wide matrix has a diagonal near 1
    for (size_t r = 0; r < 16; ++r) {
        double dot = 0.0;
        for (size_t c = 0; c < 48; ++c) dot += double(out[r * 48 + c]) * out[r * 48 + c];
        diag += dot;
    }
    EXPECT_NEAR(diag / 16.0, 0.85, 0.2);
    EXPECT_EQ(muon_newton_schulz_host(in.data(), out.data(), 16, 48, MUON_COEFFICIENTS_CUSTOM + 1, 5, MUON_NS_PRECISION_F32),
              MUON_STATUS_INVALID_ENUM_VALUE);
    // The custom set's table comes only with a config (muon_newton_schulz_host_config).
    EXPECT_EQ(muon_newton_schulz_host(in.data(), out.data(), 16, 48, MUON_COEFFICIENTS_CUSTOM, 5, MUON_NS_PRECISION_F32),
              MUON_STATUS_OUT_OF_RANGE);
    EXPECT_NE(last_error().find("custom coefficients"), std::string::npos) << last_error();
}

// The config variant: with the standard method it is the utility above bit for bit; with the
// Gram method (16 × 48: n/m = 3, where it applies) another rounding of the same result.
TEST(MultiRank, NewtonSchulzReferenceUtilityTakesTheConfigsMethod) {
    std::vector<float> in(16 * 48), plain(16 * 48), standard(16 * 48), gram(16 * 48);
    for (size_t i = 0; i < in.size(); ++i) in[i] = noise(i);
    muon_config_t cfg = default_config();
    cfg.muon_coefficient_set = MUON_COEFFICIENTS_SIMPLE;
    cfg.muon_ns_precision = MUON_NS_PRECISION_F32;
    ASSERT_EQ(muon_newton_schulz_host(in.data(), plain.data(), 16, 48, MUON_COEFFICIENTS_SIMPLE, 5, MUON_NS_PRECISION_F32),
              MUON_STATUS_SUCCESS)
        << last_error();
    muon::newton_schulz_host(in, standard, 16, 48, cfg);
    EXPECT_EQ(std::memcmp(plain.data(), standard.data(), plain.size() * sizeof(float)), 0);
    cfg.muon_ns_method = MUON_NS_METHOD_GRAM;
    muon::newton_schulz_host(in, gram, 16, 48, cfg);
    EXPECT_NE(std::memcmp(standard.data(), gram.data(), gram.size() * sizeof(float)), 0);
    for (size_t i = 0; i < gram.size(); ++i) EXPECT_NEAR(gram[i], standard[i], 1e-4f) << i;
    cfg.muon_ns_method = MUON_NS_METHOD_GRAM + 1;
    EXPECT_EQ(muon_newton_schulz_host_config(in.data(), gram.data(), 16, 48, &cfg), MUON_STATUS_INVALID_ENUM_VALUE);
    EXPECT_NE(last_error().find("muon_ns_method"), std::string::npos) << last_error();
}
