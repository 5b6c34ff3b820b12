// Error paths through the C header: NULL arguments, wrong call order, destroy(NULL), bad
// struct_size, and the per-thread last error.
#include "muon_test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>

TEST(Errors, DestroyNullIsSuccess) {
    EXPECT_EQ(muon_optimizer_destroy(nullptr), MUON_STATUS_SUCCESS);
    EXPECT_EQ(muon_comm_destroy(nullptr), MUON_STATUS_SUCCESS);
}

TEST(Errors, NullArgumentsGiveNullArgumentStatus) {
    EXPECT_EQ(muon_config_validate(nullptr), MUON_STATUS_NULL_ARGUMENT);
    EXPECT_NE(last_error().find("cfg is NULL"), std::string::npos) << last_error();
    EXPECT_EQ(muon_host_group_create(2, nullptr), MUON_STATUS_NULL_ARGUMENT);
    muon_config_t cfg = default_config();
    muon_optimizer_t *opt = nullptr;
    EXPECT_EQ(muon_optimizer_create(&cfg, nullptr, nullptr, &opt), MUON_STATUS_NULL_ARGUMENT);
    EXPECT_EQ(opt, nullptr);
    EXPECT_EQ(muon_optimizer_finalize(nullptr), MUON_STATUS_NULL_ARGUMENT);
    EXPECT_EQ(muon_optimizer_add_param(nullptr, nullptr, nullptr), MUON_STATUS_NULL_ARGUMENT);
    uint32_t rank = 0;
    EXPECT_EQ(muon_comm_rank(nullptr, &rank), MUON_STATUS_NULL_ARGUMENT);
    muon_config_init(nullptr);  // ignored, no crash
}

TEST(Errors, StatusStringsAreStaticAndNeverNull) {
    EXPECT_STREQ(muon_status_string(MUON_STATUS_SUCCESS), "success");
    EXPECT_STREQ(muon_status_string(123456), "unknown status");
    EXPECT_NE(std::strlen(muon_status_string(MUON_STATUS_COMM_TIMEOUT)), 0u);
    EXPECT_NE(muon_last_error_message(), nullptr);
}

TEST(Errors, BadStructSizeIsAbiMismatch) {
    muon_config_t cfg = default_config();
    cfg.struct_size = 12;
    EXPECT_EQ(muon_config_validate(&cfg), MUON_STATUS_ABI_MISMATCH);
    EXPECT_NE(last_error().find("struct_size"), std::string::npos) << last_error();
}

TEST(Errors, WrongCallOrderIsAStateError) {
    auto comms = make_host_group(1);
    ASSERT_EQ(comms.size(), 1u);
    muon_config_t cfg = default_config();
    muon_optimizer_t *opt = nullptr;
    ASSERT_EQ(muon_optimizer_create(&cfg, comms[0], nullptr, &opt), MUON_STATUS_SUCCESS) << last_error();
    EXPECT_EQ(muon_optimizer_finalize(opt), MUON_STATUS_INVALID_STATE);
    muon_param_desc_t w = make_desc("w", {64, 64});
    ASSERT_EQ(muon_optimizer_add_param(opt, &w, nullptr), MUON_STATUS_SUCCESS) << last_error();
    size_t len = 0;
    EXPECT_EQ(muon_optimizer_plan_json(opt, nullptr, 0, &len), MUON_STATUS_INVALID_STATE);
    ASSERT_EQ(muon_optimizer_finalize(opt), MUON_STATUS_SUCCESS) << last_error();
    muon_param_desc_t late = make_desc("late", {8});
    EXPECT_EQ(muon_optimizer_add_param(opt, &late, nullptr), MUON_STATUS_INVALID_STATE);
    EXPECT_NE(last_error().find("finalized"), std::string::npos) << last_error();
    EXPECT_EQ(muon_optimizer_destroy(opt), MUON_STATUS_SUCCESS);
    EXPECT_EQ(muon_comm_destroy(comms[0]), MUON_STATUS_SUCCESS);
}

TEST(Errors, LastErrorIsPerThread) {
    muon_config_t bad = default_config();
    bad.muon_momentum = 2.0f;
    ASSERT_EQ(muon_config_validate(&bad), MUON_STATUS_OUT_OF_RANGE);
    const std::string mine = last_error();
    std::string theirs_before, theirs_after;
    std::thread other([&] {
        theirs_before = last_error();
        muon_config_t cfg = default_config();
        cfg.muon_layout = 42;
        EXPECT_EQ(muon_config_validate(&cfg), MUON_STATUS_INVALID_ENUM_VALUE);
        theirs_after = last_error();
    });
    other.join();
    EXPECT_EQ(theirs_before, "");
    EXPECT_NE(theirs_after.find("muon_layout"), std::string::npos) << theirs_after;
    EXPECT_EQ(last_error(), mine);
    EXPECT_NE(mine.find("muon_momentum"), std::string::npos) << mine;
}

TEST(Errors, NcclAbsentIsADedicatedStatus) {
    muon_comm_t *comm = nullptr;
    auto *fake = reinterpret_cast<struct ncclComm *>(0x1000);
    EXPECT_EQ(muon_comm_create_nccl(fake, &comm), MUON_STATUS_NCCL_UNAVAILABLE);
    EXPECT_EQ(comm, nullptr);
    EXPECT_NE(last_error().find("libnccl.so.2"), std::string::npos) << last_error();
    EXPECT_FALSE(muon_cuda_available());
}
