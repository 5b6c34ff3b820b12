// QK-clip through the C++ layer (muon_opt.hpp) on one host rank: the step clips the query and
// key rows of a fused QKV's group whose max logit exceeds tau, and a refused request throws
// muon::Error with INVALID_ARGUMENT and changes nothing.
#include "muon_opt.hpp"
#include "muon_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

// A fused QKV of 2 query groups of 2 heads, head dim 8: per group 16 query, 8 key, 8 value rows.
constexpr int64_t kRows = 64, kCols = 32;

void step_without_update(muon::Optimizer &opt, uint32_t id) {
    opt.zero_grad();
    opt.grad_ready(id);
    opt.step(muon::step_args(0.0f, 0.0f, 0.0f, 0.0f));
}

}  // namespace

TEST(QkClip, TheStepClipsTheGroupOverTauAndRefusalsChangeNothing) {
    auto comms = muon::Comm::host_group(1);
    muon::Optimizer opt(muon::default_config(), comms[0]);
    std::vector<float> init(static_cast<size_t>(kRows * kCols));
    for (size_t i = 0; i < init.size(); ++i) init[i] = 0.1f * noise(i);
    muon_param_desc_t d = muon::param_desc("attn.qkv.weight", {kRows, kCols});
    const int64_t splits[3] = {16, 8, 8};
    d.split_sizes = splits;
    d.num_splits = 3;
    d.num_split_groups = 2;
    d.dtype = MUON_DTYPE_F32;
    d.init_data = init.data();
    d.init_dtype = MUON_DTYPE_F32;
    const uint32_t id = opt.add_param(d);
    opt.finalize();
    const muon::ParamView view = opt.param_view(id);
    const std::vector<float> before(view.data_span<float>().begin(), view.data_span<float>().end());

    const float nan_maxima[4] = {40.0f, NAN, 9.0f, 9.5f};
    try {
        opt.qk_clip({muon::qk_clip_desc(id, MUON_QK_KIND_FUSED_QKV, 4, 2, 8, nan_maxima)}, 10.0f);
        FAIL() << "a NaN maximum was accepted";
    } catch (const muon::Error &e) {
        EXPECT_EQ(e.status(), MUON_STATUS_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("max_logits[1] is NaN"), std::string::npos) << e.what();
    }
    step_without_update(opt, id);
    EXPECT_EQ(std::vector<float>(view.data_span<float>().begin(), view.data_span<float>().end()), before);

    // Group 0: max 40 > tau = 10, eta = 1/4, alpha = 1/2: its query and key rows x 1/2 exactly.
    const float maxima[4] = {40.0f, 3.0f, 9.0f, 9.5f};
    opt.qk_clip({muon::qk_clip_desc(id, MUON_QK_KIND_FUSED_QKV, 4, 2, 8, maxima)}, 10.0f, 0.5f);
    step_without_update(opt, id);
    const auto after = view.data_span<float>();
    for (size_t i = 0; i < before.size(); ++i) {
        const float expected = i < static_cast<size_t>(24 * kCols) ? before[i] * 0.5f : before[i];
        EXPECT_EQ(after[i], expected) << "element " << i;
    }
}
