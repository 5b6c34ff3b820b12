// Routing through the header, including the multi-token-prediction duplicate embedding.
#include "muon_test_util.h"

#include <gtest/gtest.h>

#include <string>

class Routing : public ::testing::Test {
  protected:
    void SetUp() override {
        comms_ = make_host_group(1);
        ASSERT_EQ(comms_.size(), 1u);
        cfg_ = default_config();
    }
    void Create() { ASSERT_EQ(muon_optimizer_create(&cfg_, comms_[0], nullptr, &opt_), MUON_STATUS_SUCCESS) << last_error(); }
    void TearDown() override {
        EXPECT_EQ(muon_optimizer_destroy(opt_), MUON_STATUS_SUCCESS);
        EXPECT_EQ(muon_comm_destroy(comms_[0]), MUON_STATUS_SUCCESS);
    }
    uint32_t RouteOf(uint32_t id) {
        uint32_t route = 99;
        EXPECT_EQ(muon_optimizer_param_route(opt_, id, &route), MUON_STATUS_SUCCESS) << last_error();
        return route;
    }
    std::vector<muon_comm_t *> comms_;
    muon_config_t cfg_{};
    muon_optimizer_t *opt_ = nullptr;
};

TEST_F(Routing, MatricesGoToMuonEverythingElseToAdamW) {
    Create();
    uint32_t id = 0;
    muon_param_desc_t w = make_desc("layers.0.fc1.weight", {128, 64});
    ASSERT_EQ(muon_optimizer_add_param(opt_, &w, &id), MUON_STATUS_SUCCESS);
    EXPECT_EQ(RouteOf(id), MUON_ROUTE_MUON);
    muon_param_desc_t b = make_desc("layers.0.fc1.bias", {128});
    ASSERT_EQ(muon_optimizer_add_param(opt_, &b, &id), MUON_STATUS_SUCCESS);
    EXPECT_EQ(RouteOf(id), MUON_ROUTE_ADAMW);
    muon_param_desc_t e = make_desc("embedding.weight", {1000, 64});
    e.flags = MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT;
    ASSERT_EQ(muon_optimizer_add_param(opt_, &e, &id), MUON_STATUS_SUCCESS);
    EXPECT_EQ(RouteOf(id), MUON_ROUTE_ADAMW);
    muon_param_desc_t x = make_desc("experts.fc1.weight", {8, 64, 32});
    x.flags = MUON_PARAM_FLAG_EXPERT_STACK;
    ASSERT_EQ(muon_optimizer_add_param(opt_, &x, &id), MUON_STATUS_SUCCESS);
    EXPECT_EQ(RouteOf(id), MUON_ROUTE_MUON);
}

TEST_F(Routing, MtpDuplicateEmbeddingInTieGroupFailsNamingBoth) {
    Create();
    muon_param_desc_t emb = make_desc("embedding.word_embeddings.weight", {1000, 64});
    emb.flags = MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT;
    emb.tie_group = 3;
    ASSERT_EQ(muon_optimizer_add_param(opt_, &emb, nullptr), MUON_STATUS_SUCCESS);
    muon_param_desc_t mtp = make_desc("mtp.layers.0.embedding.word_embeddings.weight", {1000, 64});
    mtp.tie_group = 3;
    EXPECT_EQ(muon_optimizer_add_param(opt_, &mtp, nullptr), MUON_STATUS_ROUTING_CONFLICT);
    const std::string msg = last_error();
    EXPECT_NE(msg.find("'embedding.word_embeddings.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'mtp.layers.0.embedding.word_embeddings.weight'"), std::string::npos) << msg;
}

TEST_F(Routing, MtpDuplicateWithoutTieGroupIsCaughtByVocabSize) {
    cfg_.vocab_size = 1000;
    Create();
    muon_param_desc_t mtp = make_desc("mtp.embedding.weight", {1000, 64});
    EXPECT_EQ(muon_optimizer_add_param(opt_, &mtp, nullptr), MUON_STATUS_ROUTING_CONFLICT);
    EXPECT_NE(last_error().find("vocab_size 1000"), std::string::npos) << last_error();
}

TEST_F(Routing, InvalidDescriptionsAreRejected) {
    Create();
    muon_param_desc_t zero = make_desc("zero", {4, 0});
    EXPECT_EQ(muon_optimizer_add_param(opt_, &zero, nullptr), MUON_STATUS_INVALID_PARAM);
    muon_param_desc_t mx = make_desc("mx", {48, 64});
    mx.flags = MUON_PARAM_FLAG_MXFP8;
    EXPECT_EQ(muon_optimizer_add_param(opt_, &mx, nullptr), MUON_STATUS_INVALID_PARAM);
    EXPECT_NE(last_error().find("multiples of 32"), std::string::npos) << last_error();
    muon_param_desc_t flags = make_desc("flags", {4, 4});
    flags.flags = 1u << 30;
    EXPECT_EQ(muon_optimizer_add_param(opt_, &flags, nullptr), MUON_STATUS_INVALID_PARAM);
    muon_param_desc_t a = make_desc("dup", {4});
    ASSERT_EQ(muon_optimizer_add_param(opt_, &a, nullptr), MUON_STATUS_SUCCESS);
    EXPECT_EQ(muon_optimizer_add_param(opt_, &a, nullptr), MUON_STATUS_DUPLICATE_NAME);
}
