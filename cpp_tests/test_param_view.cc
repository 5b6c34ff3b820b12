// muon_param_view_t's dtypes and its older layout, and muon::ParamView's typed spans: a span
// whose element type does not match the storage's dtype throws instead of reaching past it.
#include "muon_opt.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>

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
