// Host group creation, rank/size queries and destruction.
#include "muon_test_util.h"

#include <gtest/gtest.h>

TEST(HostGroup, RanksAndSizes) {
    auto comms = make_host_group(4);
    ASSERT_EQ(comms.size(), 4u) << last_error();
    for (uint32_t r = 0; r < 4; ++r) {
        uint32_t rank = 99, size = 99;
        EXPECT_EQ(muon_comm_rank(comms[r], &rank), MUON_STATUS_SUCCESS);
        EXPECT_EQ(muon_comm_size(comms[r], &size), MUON_STATUS_SUCCESS);
        EXPECT_EQ(rank, r);
        EXPECT_EQ(size, 4u);
    }
    for (auto *c : comms) EXPECT_EQ(muon_comm_destroy(c), MUON_STATUS_SUCCESS);
}

TEST(HostGroup, RejectsZeroRanks) {
    muon_comm_t *one = nullptr;
    EXPECT_EQ(muon_host_group_create(0, &one), MUON_STATUS_OUT_OF_RANGE);
    EXPECT_EQ(one, nullptr);
}
