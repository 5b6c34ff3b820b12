// muon_param_view_t's dtypes and its older layout, and muon::ParamView's typed spans: a span
// whose element type does not match the storage's dtype throws instead of reaching past it.
#include "muon_opt.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace {

// One bf16 matrix, f32 gradients (the default grad_dtype).
uint32_t add_bf16_matrix(muon::Optimizer &opt) {
    muon_param_desc_t d = muon::param_desc("layers.0.proj.weight", {64, 32});
    d.dtype = MUON_DTYPE_BF16;
    return opt.add_param(d);
}

}  // namespace

TEST(ParamView, SpansCheckTheElementTypeAgainstTheDtype) {
    auto comms = muon::Comm::host_group(1);
    muon::Optimizer opt(muon::default_config(), comms[0]);
    const uint32_t id = add_bf16_matrix(opt);
    opt.finalize();
    const muon::ParamView view = opt.param_view(id);
    EXPECT_EQ(view.dtype, static_cast<uint32_t>(MUON_DTYPE_BF16));
    EXPECT_EQ(view.grad_dtype, static_cast<uint32_t>(MUON_DTYPE_F32));
    EXPECT_EQ(view.data_span<uint16_t>().size(), static_cast<std::size_t>(64 * 32));
    EXPECT_EQ(view.grad_span<float>().size(), static_cast<std::size_t>(64 * 32));
    EXPECT_THROW(view.data_span<float>(), std::invalid_argument);
    EXPECT_THROW(view.grad_span<uint16_t>(), std::invalid_argument);
    EXPECT_THROW(view.data_span<uint8_t>(), std::invalid_argument);
}

TEST(ParamView, TheBucketCountCoversEveryViewsBucket) {
    auto comms = muon::Comm::host_group(1);
    muon_config_t cfg = muon::default_config();
    cfg.bucket_size = 1024;
    muon::Optimizer opt(cfg, comms[0]);
    for (int i = 0; i < 4; ++i) {
        opt.add_param(muon::param_desc(("layers." + std::to_string(i) + ".proj.weight").c_str(), {64, 32}));
    }
    EXPECT_THROW(opt.num_buckets(), muon::Error);
    opt.finalize();
    uint32_t largest = 0;
    for (uint32_t id = 0; id < 4; ++id) largest = std::max(largest, opt.param_view(id).bucket);
    EXPECT_EQ(opt.num_buckets(), largest + 1);
    EXPECT_GT(opt.num_buckets(), 1u);
    for (uint32_t b = 0; b < opt.num_buckets(); ++b) opt.wait_params(b);
    EXPECT_THROW(opt.wait_params(opt.num_buckets()), muon::Error);
}

TEST(ParamView, AStructOfTheOlderLayoutGetsItsOwnBytesOnly) {
    auto comms = muon::Comm::host_group(1);
    muon::Optimizer opt(muon::default_config(), comms[0]);
    const uint32_t id = add_bf16_matrix(opt);
    opt.finalize();
    muon_param_view_t view;
    std::memset(&view, 0xAB, sizeof view);
    view.struct_size = offsetof(muon_param_view_t, dtype);
    ASSERT_EQ(muon_optimizer_param_view(opt.get(), id, &view), MUON_STATUS_SUCCESS) << muon_last_error_message();
    EXPECT_EQ(view.struct_size, offsetof(muon_param_view_t, dtype));
    EXPECT_EQ(view.numel, 64u * 32u);
    EXPECT_EQ(view.dtype, 0xABABABABu) << "a field past the caller's struct_size was written";
    view.struct_size = offsetof(muon_param_view_t, dtype) - 8;
    EXPECT_EQ(muon_optimizer_param_view(opt.get(), id, &view), MUON_STATUS_ABI_MISMATCH);
}

TEST(ParamView, ParamScalesChangeAfterFinalizeAndRefuseBadValues) {
    auto comms = muon::Comm::host_group(1);
    muon::Optimizer opt(muon::default_config(), comms[0]);
    const uint32_t id = add_bf16_matrix(opt);
    EXPECT_THROW(opt.set_param_scales(id, 0.5f, 1.0f), muon::Error);  // before finalize
    opt.finalize();
    opt.set_param_scales(id, 0.5f, 0.0f);
    try {
        opt.set_param_scales(id, -1.0f, 1.0f);
        FAIL() << "a negative lr_scale was accepted";
    } catch (const muon::Error &e) {
        EXPECT_EQ(e.status(), MUON_STATUS_OUT_OF_RANGE);
        EXPECT_NE(std::string(e.what()).find("lr_scale -1 must be finite and >= 0"), std::string::npos) << e.what();
    }
    EXPECT_THROW(opt.set_param_scales(id + 1, 1.0f, 1.0f), muon::Error);
}
