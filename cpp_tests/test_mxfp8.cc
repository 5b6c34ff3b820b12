// MXFP8 params through the header on 2 host ranks: the views expose MXFP8 copies (no bf16
// data), every rank holds identical bytes after each step, the bytes change every step, and
// they equal the library's own quantization of the same params trained as plain bf16.
#include "muon_test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr int kRanks = 2;
constexpr int kSteps = 4;

struct Result {
    std::vector<std::vector<uint8_t>> rowwise;  // per step, the rowwise data of "fc.weight"
};

Result train(muon_comm_t *comm, int rank, bool mxfp8) {
    muon_config_t cfg = default_config();
    cfg.mxfp8_param_gather = 1;
    cfg.clip_grad = 0.0f;
    cfg.muon_ns_precision = MUON_NS_PRECISION_F32;
    muon_optimizer_t *opt = nullptr;
    EXPECT_EQ(muon_optimizer_create(&cfg, comm, nullptr, &opt), MUON_STATUS_SUCCESS) << last_error();
    std::vector<float> init(64 * 96);
    for (size_t i = 0; i < init.size(); ++i) init[i] = 0.1f * noise(i);
    muon_param_desc_t d = make_desc("fc.weight", {64, 96});
    d.flags = mxfp8 ? MUON_PARAM_FLAG_MXFP8 : 0;
    d.init_data = init.data();
    EXPECT_EQ(muon_optimizer_add_param(opt, &d, nullptr), MUON_STATUS_SUCCESS) << last_error();
    EXPECT_EQ(muon_optimizer_finalize(opt), MUON_STATUS_SUCCESS) << last_error();
    muon_param_view_t v{};
    v.struct_size = sizeof v;
    EXPECT_EQ(muon_optimizer_param_view(opt, 0, &v), MUON_STATUS_SUCCESS);
    uint64_t shapes[4];
    EXPECT_EQ(muon_mxfp8_scale_shape(64, 96, shapes), MUON_STATUS_SUCCESS);
    std::vector<uint8_t> rd(64 * 96), rs(shapes[0] * shapes[1]), cd(64 * 96), cs(shapes[2] * shapes[3]);
    if (mxfp8) {
        EXPECT_EQ(v.data, nullptr);
        EXPECT_NE(v.mxfp8_rowwise_data, nullptr);
        EXPECT_EQ(v.mxfp8_rows, 64u);
        EXPECT_EQ(v.mxfp8_cols, 96u);
    }
    Result result;
    EXPECT_EQ(muon_optimizer_zero_grad(opt), MUON_STATUS_SUCCESS);
    for (int step = 0; step < kSteps; ++step) {
        auto *g = static_cast<float *>(v.grad);
        for (size_t i = 0; i < init.size(); ++i) g[i] = noise((uint64_t(step) << 40) ^ (uint64_t(rank) << 32) ^ i);
        EXPECT_EQ(muon_optimizer_grad_ready(opt, 0), MUON_STATUS_SUCCESS) << last_error();
        muon_step_args_t args = make_step_args(0.02f, 0.1f, 0.003f, 0.01f);
        EXPECT_EQ(muon_optimizer_step(opt, &args, nullptr), MUON_STATUS_SUCCESS) << last_error();
        EXPECT_EQ(muon_optimizer_zero_grad(opt), MUON_STATUS_SUCCESS);
        EXPECT_EQ(muon_optimizer_wait_params(opt, v.bucket), MUON_STATUS_SUCCESS);
        if (mxfp8) {
            result.rowwise.emplace_back(v.mxfp8_rowwise_data, v.mxfp8_rowwise_data + rd.size());
        } else {
            EXPECT_EQ(muon_mxfp8_quantize_host(v.data, MUON_DTYPE_BF16, 64, 96, MUON_MXFP8_SCALES_COMPACT, rd.data(),
                                               rs.data(), cd.data(), cs.data()),
                      MUON_STATUS_SUCCESS)
                << last_error();
            result.rowwise.push_back(rd);
        }
    }
    EXPECT_EQ(muon_optimizer_destroy(opt), MUON_STATUS_SUCCESS);
    return result;
}

std::vector<Result> run_group(bool mxfp8) {
    auto comms = make_host_group(kRanks);
    std::vector<Result> results(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) threads.emplace_back([&, r] { results[r] = train(comms[r], r, mxfp8); });
    for (auto &t : threads) t.join();
    for (auto *c : comms) EXPECT_EQ(muon_comm_destroy(c), MUON_STATUS_SUCCESS);
    return results;
}

}  // namespace

TEST(Mxfp8MultiRank, GatheredMxfp8EqualsQuantizedBf16OnEveryRank) {
    auto mx = run_group(true);
    auto plain = run_group(false);
    for (int r = 0; r < kRanks; ++r) {
        ASSERT_EQ(mx[r].rowwise.size(), static_cast<size_t>(kSteps));
        for (int s = 0; s < kSteps; ++s) {
            EXPECT_EQ(mx[r].rowwise[s], mx[0].rowwise[s]) << "rank " << r << " step " << s;
            EXPECT_EQ(mx[r].rowwise[s], plain[r].rowwise[s]) << "rank " << r << " step " << s;
            if (s > 0) {
                EXPECT_NE(mx[r].rowwise[s], mx[r].rowwise[s - 1]) << "params froze at step " << s;
            }
        }
    }
}

TEST(Mxfp8MultiRank, QuantizeHostRejectsBadArguments) {
    std::vector<uint16_t> x(32 * 32, 0x3F80);
    std::vector<uint8_t> d(32 * 32), s(128 * 4), cd(32 * 32), cs(4 * 128);
    EXPECT_EQ(muon_mxfp8_quantize_host(x.data(), MUON_DTYPE_BF16, 32, 32, 7, d.data(), s.data(), cd.data(), cs.data()),
              MUON_STATUS_INVALID_ENUM_VALUE);
    EXPECT_EQ(muon_mxfp8_quantize_host(nullptr, MUON_DTYPE_BF16, 32, 32, 0, d.data(), s.data(), cd.data(), cs.data()),
              MUON_STATUS_NULL_ARGUMENT);
    ASSERT_EQ(muon_mxfp8_quantize_host(x.data(), MUON_DTYPE_BF16, 32, 32, 0, d.data(), s.data(), cd.data(), cs.data()),
              MUON_STATUS_SUCCESS);
    EXPECT_EQ(d[0], 0x78);  // 1.0 in a block of ones: scale 2^-8, code 0x78 (docs/mxfp8.md §8)
    EXPECT_EQ(s[0], 0x77);
}
