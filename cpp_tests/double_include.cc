// The header included twice in one C++17 translation unit (include guard, no redefinitions).
#include "muon_opt.h"
#include "muon_opt.h"

#include <gtest/gtest.h>

extern "C" int muon_c99_config_roundtrip(void);

TEST(Header, CompilesAsCppIncludedTwice) {
    EXPECT_EQ(muon_get_version(), static_cast<uint32_t>(MUON_VERSION_CODE));
    EXPECT_EQ(MUON_VERSION_CODE, MUON_VERSION_MAJOR * 10000 + MUON_VERSION_MINOR * 100 + MUON_VERSION_PATCH);
}

TEST(Header, C99TranslationUnitAgreesWithTheLibrary) { EXPECT_EQ(muon_c99_config_roundtrip(), 0); }
