// A step's overrides of the config's momentum and betas through the C++ layer (muon_opt.hpp) on
// one host rank: the helpers set each MUON_STEP_OVERRIDE_* bit with its value; a caller
// compiled against the first, 20-byte muon_step_args_t overrides nothing whatever follows it;
// an override moves the params; a bad one throws muon::Error OUT_OF_RANGE naming the field and
// changes nothing. The decoupled learning rate steps the embedding and output params only.
#include "muon_opt.hpp"
#include "muon_test_util.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

constexpr int64_t kRows = 16, kCols = 8;

// The param after two steps with `args` on two different gradients (the second update's
// direction depends on the momentum).
std::vector<float> two_steps(const muon_step_args_t &args) {
    auto comms = muon::Comm::host_group(1);
    muon::Optimizer opt(muon::default_config(), comms[0]);
    muon_param_desc_t d = muon::param_desc("w", {kRows, kCols});
    d.dtype = MUON_DTYPE_F32;
    const uint32_t id = opt.add_param(d);
    opt.finalize();
    const muon::ParamView view = opt.param_view(id);
    for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        auto grad = view.grad_span<float>();
        for (size_t i = 0; i < grad.size(); ++i) grad[i] = step == 0 ? 1.0f : static_cast<float>(i % 3) - 1.0f;
        opt.grad_ready(id);
        opt.step(args);
    }
    return std::vector<float>(view.data_span<float>().begin(), view.data_span<float>().end());
}

// An embedding (EMBEDDING_OR_OUTPUT) and a bias after two steps with `args`: {embedding, bias}.
std::vector<std::vector<float>> embedding_and_bias(const muon_step_args_t &args) {
    auto comms = muon::Comm::host_group(1);
    muon::Optimizer opt(muon::default_config(), comms[0]);
    muon_param_desc_t e = muon::param_desc("embedding.weight", {32, kCols});
    e.dtype = MUON_DTYPE_F32;
    e.flags = MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT;
    muon_param_desc_t b = muon::param_desc("layer.bias", {kCols});
    b.dtype = MUON_DTYPE_F32;
    const uint32_t ids[] = {opt.add_param(e), opt.add_param(b)};
    opt.finalize();
    const muon::ParamView views[] = {opt.param_view(ids[0]), opt.param_view(ids[1])};
    for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        for (const muon::ParamView &view : views) {
            auto grad = view.grad_span<float>();
            for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>((i + step) % 5) - 2.0f;
        }
        opt.step(args);
    }
    std::vector<std::vector<float>> out;
    for (const muon::ParamView &view : views) out.emplace_back(view.data_span<float>().begin(), view.data_span<float>().end());
    return out;
}

}  // namespace

TEST(StepArgs, TheDecoupledLrStepsTheEmbeddingAlone) {
    const muon_step_args_t plain = muon::step_args(0.02f, 0.1f, 1e-3f, 0.1f);
    const muon_step_args_t decoupled = muon::with_decoupled_lr(plain, 3e-2f);
    EXPECT_EQ(decoupled.overrides, MUON_STEP_OVERRIDE_DECOUPLED_LR);
    EXPECT_EQ(decoupled.decoupled_lr, 3e-2f);
    const auto got = embedding_and_bias(decoupled);
    const auto at_adam_lr = embedding_and_bias(plain);
    const auto at_decoupled_lr = embedding_and_bias(muon::step_args(0.02f, 0.1f, 3e-2f, 0.1f));
    EXPECT_EQ(got[0], at_decoupled_lr[0]) << "the embedding steps with decoupled_lr";
    EXPECT_NE(got[0], at_adam_lr[0]);
    EXPECT_EQ(got[1], at_adam_lr[1]) << "the bias steps with adam_lr";
    EXPECT_NE(got[1], at_decoupled_lr[1]);
}

TEST(StepArgs, HelpersSetTheOverrideBitsAndValues) {
    const muon_step_args_t plain = muon::step_args(0.02f, 0.1f, 3e-4f, 0.1f);
    EXPECT_EQ(plain.struct_size, sizeof(muon_step_args_t));
    EXPECT_EQ(plain.overrides, 0u);
    const muon_step_args_t a =
        muon::with_adam_eps(muon::with_adam_betas(muon::with_muon_momentum(plain, 0.9f), 0.8f, 0.95f), 1e-6f);
    EXPECT_EQ(a.overrides, MUON_STEP_OVERRIDE_MUON_MOMENTUM | MUON_STEP_OVERRIDE_ADAM_BETA1 |
                               MUON_STEP_OVERRIDE_ADAM_BETA2 | MUON_STEP_OVERRIDE_ADAM_EPS);
    EXPECT_EQ(a.muon_momentum, 0.9f);
    EXPECT_EQ(a.adam_beta1, 0.8f);
    EXPECT_EQ(a.adam_beta2, 0.95f);
    EXPECT_EQ(a.adam_eps, 1e-6f);
    EXPECT_EQ(a.lr, 0.02f);
}

TEST(StepArgs, TheFirstLayoutOverridesNothingAndBadOverridesThrow) {
    const muon_step_args_t plain = muon::step_args(0.02f, 0.1f, 3e-4f, 0.1f);
    const std::vector<float> config = two_steps(plain);
    muon_step_args_t first = muon::with_muon_momentum(plain, 0.5f);
    EXPECT_NE(two_steps(first), config) << "the momentum override reaches the step";
    first.struct_size = 20;  // sizeof the layout that ended at adam_weight_decay
    EXPECT_EQ(two_steps(first), config) << "the 20-byte layout overrides nothing";
    try {
        two_steps(muon::with_muon_momentum(plain, 1.0f));
        FAIL() << "a momentum of 1 was accepted";
    } catch (const muon::Error &e) {
        EXPECT_EQ(e.status(), MUON_STATUS_OUT_OF_RANGE);
        EXPECT_NE(std::string(e.what()).find("args->muon_momentum 1 is outside [0, 1)"), std::string::npos) << e.what();
    }
}
