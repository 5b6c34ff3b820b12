// param_sharding = sharded through the C header: the gather window's entry points are NULL-safe
// and order-safe, a param outside its gathered window is refused naming it and its bucket, and
// a bucket's views are the same at every gather.
#include "muon_test_util.h"

#include <gtest/gtest.h>

#include <string>

namespace {

struct Sharded {
    std::vector<muon_comm_t *> comms = make_host_group(1);
    muon_optimizer_t *opt = nullptr;

    explicit Sharded(bool finalize = true) {
        muon_config_t cfg = default_config();
        cfg.param_sharding = MUON_PARAM_SHARDING_SHARDED;
        cfg.param_prefetch_buckets = 0;
        cfg.bucket_size = 4096;
        EXPECT_EQ(muon_optimizer_create(&cfg, comms[0], nullptr, &opt), MUON_STATUS_SUCCESS) << last_error();
        for (int i = 0; i < 3; ++i) {
            std::string name = "layers." + std::to_string(i) + ".weight";
            muon_param_desc_t w = make_desc(name.c_str(), {64, 64});
            EXPECT_EQ(muon_optimizer_add_param(opt, &w, nullptr), MUON_STATUS_SUCCESS) << last_error();
        }
        if (finalize) {
            EXPECT_EQ(muon_optimizer_finalize(opt), MUON_STATUS_SUCCESS) << last_error();
        }
    }
    ~Sharded() {
        EXPECT_EQ(muon_optimizer_destroy(opt), MUON_STATUS_SUCCESS);
        EXPECT_EQ(muon_comm_destroy(comms[0]), MUON_STATUS_SUCCESS);
    }
    /// Gathers the buckets one at a time until @p param's view is granted; that bucket stays
    /// gathered.
    uint32_t bucket_of(uint32_t param) {
        for (uint32_t k = 0; k < 3; ++k) {
            if (muon_optimizer_gather_params(opt, k) != MUON_STATUS_SUCCESS) break;
            muon_param_view_t view{};
            view.struct_size = sizeof(view);
            if (muon_optimizer_param_view(opt, param, &view) == MUON_STATUS_SUCCESS) return k;
            EXPECT_EQ(muon_optimizer_release_params(opt, k), MUON_STATUS_SUCCESS) << last_error();
        }
        return UINT32_MAX;
    }
};

}  // namespace

TEST(Sharding, NullHandlesAreNullArguments) {
    EXPECT_EQ(muon_optimizer_gather_params(nullptr, 0), MUON_STATUS_NULL_ARGUMENT);
    EXPECT_NE(last_error().find("muon_optimizer_gather_params"), std::string::npos) << last_error();
    EXPECT_EQ(muon_optimizer_release_params(nullptr, 0), MUON_STATUS_NULL_ARGUMENT);
    EXPECT_NE(last_error().find("muon_optimizer_release_params"), std::string::npos) << last_error();
}

TEST(Sharding, WrongOrderIsAStateError) {
    Sharded before(false);
    EXPECT_EQ(muon_optimizer_gather_params(before.opt, 0), MUON_STATUS_INVALID_STATE);
    EXPECT_NE(last_error().find("not finalized"), std::string::npos) << last_error();
    Sharded s;
    EXPECT_EQ(muon_optimizer_gather_params(s.opt, 99), MUON_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(muon_optimizer_release_params(s.opt, 0), MUON_STATUS_INVALID_STATE);
    EXPECT_NE(last_error().find("bucket 0 is not gathered"), std::string::npos) << last_error();
    ASSERT_EQ(muon_optimizer_gather_params(s.opt, 0), MUON_STATUS_SUCCESS) << last_error();
    EXPECT_EQ(muon_optimizer_gather_params(s.opt, 0), MUON_STATUS_SUCCESS) << last_error();
    EXPECT_EQ(muon_optimizer_gather_params(s.opt, 1), MUON_STATUS_INVALID_STATE);
    EXPECT_NE(last_error().find("still holds bucket 0"), std::string::npos) << last_error();
    EXPECT_EQ(muon_optimizer_release_params(s.opt, 0), MUON_STATUS_SUCCESS) << last_error();
}

TEST(Sharding, AParamOutsideItsWindowIsRefusedNamingItAndItsBucket) {
    Sharded s;
    muon_param_view_t view{};
    view.struct_size = sizeof(view);
    EXPECT_EQ(muon_optimizer_param_view(s.opt, 0, &view), MUON_STATUS_INVALID_STATE);
    EXPECT_NE(last_error().find("'layers.0.weight' is in bucket"), std::string::npos) << last_error();
    EXPECT_EQ(muon_optimizer_grad_ready(s.opt, 0), MUON_STATUS_INVALID_STATE);
    EXPECT_NE(last_error().find("which is not gathered"), std::string::npos) << last_error();
    const uint32_t b = s.bucket_of(0);
    ASSERT_NE(b, UINT32_MAX);
    ASSERT_EQ(muon_optimizer_param_view(s.opt, 0, &view), MUON_STATUS_SUCCESS) << last_error();
    void *data = view.data;
    EXPECT_EQ(muon_optimizer_release_params(s.opt, b), MUON_STATUS_SUCCESS) << last_error();
    EXPECT_EQ(muon_optimizer_wait_params(s.opt, b), MUON_STATUS_SUCCESS) << last_error();
    ASSERT_EQ(muon_optimizer_param_view(s.opt, 0, &view), MUON_STATUS_SUCCESS) << last_error();
    EXPECT_EQ(view.data, data);
    EXPECT_EQ(muon_optimizer_grad_ready(s.opt, 0), MUON_STATUS_SUCCESS) << last_error();
}
