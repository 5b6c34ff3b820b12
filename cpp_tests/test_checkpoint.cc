// Checkpoints through the C header at dp=2 (ranks on std::thread): a run that saves, and a
// fresh group that loads and continues, match an uninterrupted run bitwise; damaged files, a
// different model and a missing directory give their own status on every rank.
#include "muon_test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Param {
    const char *name;
    std::vector<int64_t> shape;
    uint32_t flags;
    std::vector<int64_t> splits;
};

const std::vector<Param> kModel = {
    {"embedding.weight", {40, 32}, MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT, {}},
    {"layers.0.fc1.weight", {64, 32}, 0, {32, 32}},
    {"layers.0.fc1.bias", {64}, 0, {}},
    {"layers.0.fc2.weight", {32, 64}, 0, {}},
    {"output.weight", {40, 32}, MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT, {}},
};
constexpr int kRanks = 2;

// One rank: an optimizer over kModel (or `model`), finalized.
struct Rank {
    muon_optimizer_t *opt = nullptr;
    std::vector<muon_param_view_t> views;
    std::vector<Param> model;

    Rank(muon_comm_t *comm, const std::vector<Param> &params) : model(params) {
        muon_config_t cfg = default_config();
        cfg.clip_grad = 0.0f;
        cfg.muon_ns_precision = MUON_NS_PRECISION_F32;
        cfg.bucket_size = 4096;
        EXPECT_EQ(muon_optimizer_create(&cfg, comm, nullptr, &opt), MUON_STATUS_SUCCESS) << last_error();
        for (size_t p = 0; p < model.size(); ++p) {
            muon_param_desc_t d = make_desc(model[p].name, model[p].shape);
            d.flags = model[p].flags;
            d.num_splits = static_cast<uint32_t>(model[p].splits.size());
            d.split_sizes = model[p].splits.empty() ? nullptr : model[p].splits.data();
            std::vector<float> init(numel(model[p].shape));
            for (size_t i = 0; i < init.size(); ++i) init[i] = 0.1f * noise(1000000 * p + i);
            d.init_data = init.data();
            d.init_dtype = MUON_DTYPE_F32;
            EXPECT_EQ(muon_optimizer_add_param(opt, &d, nullptr), MUON_STATUS_SUCCESS) << last_error();
        }
        EXPECT_EQ(muon_optimizer_finalize(opt), MUON_STATUS_SUCCESS) << last_error();
        views.resize(model.size());
        for (size_t p = 0; p < model.size(); ++p) {
            views[p].struct_size = sizeof(muon_param_view_t);
            EXPECT_EQ(muon_optimizer_param_view(opt, static_cast<uint32_t>(p), &views[p]), MUON_STATUS_SUCCESS);
        }
    }
    ~Rank() { EXPECT_EQ(muon_optimizer_destroy(opt), MUON_STATUS_SUCCESS); }
    Rank(const Rank &) = delete;
    Rank &operator=(const Rank &) = delete;

    // `steps` steps; the data of a step depend on this rank and the step count reached.
    void train(int rank, int steps) {
        for (int s = 0; s < steps; ++s) {
            EXPECT_EQ(muon_optimizer_zero_grad(opt), MUON_STATUS_SUCCESS) << last_error();
            for (size_t p = model.size(); p-- > 0;) {
                EXPECT_EQ(muon_optimizer_wait_params(opt, views[p].bucket), MUON_STATUS_SUCCESS);
                auto *w = static_cast<const uint16_t *>(views[p].data);
                auto *g = static_cast<float *>(views[p].grad);
                for (size_t i = 0; i < numel(model[p].shape); ++i) {
                    uint64_t seed = (uint64_t(step) << 40) ^ (uint64_t(rank) << 32) ^ (uint64_t(p) << 20) ^ i;
                    g[i] = noise(seed) * 0.01f + 0.05f * bf16_to_float(w[i]);
                }
                EXPECT_EQ(muon_optimizer_grad_ready(opt, static_cast<uint32_t>(p)), MUON_STATUS_SUCCESS);
            }
            muon_step_args_t args = make_step_args(0.02f, 0.1f, 0.003f, 0.01f);
            muon_step_info_t info{};
            info.struct_size = sizeof info;
            EXPECT_EQ(muon_optimizer_step(opt, &args, &info), MUON_STATUS_SUCCESS) << last_error();
            step = info.step;
        }
    }

    // Every param as this rank holds it (bf16 bits), after its param collectives.
    std::vector<uint16_t> params() {
        EXPECT_EQ(muon_optimizer_synchronize(opt), MUON_STATUS_SUCCESS);
        std::vector<uint16_t> bits;
        for (size_t p = 0; p < model.size(); ++p) {
            auto *w = static_cast<const uint16_t *>(views[p].data);
            bits.insert(bits.end(), w, w + numel(model[p].shape));
        }
        return bits;
    }

    uint64_t step = 0;
};

// Runs `body(rank, optimizer)` for a fresh 2-rank group, one thread per rank.
void with_group(const std::vector<Param> &model, const std::function<void(int, Rank &)> &body) {
    auto comms = make_host_group(kRanks);
    ASSERT_EQ(comms.size(), static_cast<size_t>(kRanks));
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
        threads.emplace_back([&, r] {
            Rank rank(comms[r], model);
            body(r, rank);
        });
    }
    for (auto &t : threads) t.join();
    for (auto *c : comms) EXPECT_EQ(muon_comm_destroy(c), MUON_STATUS_SUCCESS);
}

struct ScratchDir {
    fs::path path;
    ScratchDir() : path(fs::temp_directory_path() / ("muon-cpp-ckpt-" + std::to_string(::getpid()))) {
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~ScratchDir() { fs::remove_all(path); }
};

}  // namespace

TEST(Checkpoint, SaveThenLoadInAFreshGroupContinuesBitwise) {
    ScratchDir scratch;
    const std::string dir = (scratch.path / "ckpt").string();
    std::vector<std::vector<uint16_t>> uninterrupted(kRanks), resumed(kRanks);
    with_group(kModel, [&](int r, Rank &rank) {
        rank.train(r, 3);
        EXPECT_EQ(muon_optimizer_save(rank.opt, dir.c_str()), MUON_STATUS_SUCCESS) << last_error();
        rank.train(r, 2);
        uninterrupted[r] = rank.params();
    });
    EXPECT_TRUE(fs::exists(fs::path(dir) / "index.json"));
    EXPECT_TRUE(fs::exists(fs::path(dir) / "rank-00001.safetensors"));
    with_group(kModel, [&](int r, Rank &rank) {
        EXPECT_EQ(muon_optimizer_load(rank.opt, dir.c_str()), MUON_STATUS_SUCCESS) << last_error();
        rank.step = 3;
        rank.train(r, 2);
        EXPECT_EQ(rank.step, 5u);
        resumed[r] = rank.params();
    });
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(resumed[r], uninterrupted[r]) << "rank " << r;
    EXPECT_EQ(resumed[0], resumed[1]);
}

TEST(Checkpoint, BadCheckpointsGiveTheirStatusOnEveryRank) {
    ScratchDir scratch;
    const std::string dir = (scratch.path / "ckpt").string();
    with_group(kModel, [&](int r, Rank &rank) {
        rank.train(r, 1);
        EXPECT_EQ(muon_optimizer_save(rank.opt, dir.c_str()), MUON_STATUS_SUCCESS) << last_error();
    });

    const std::string missing = (scratch.path / "missing").string();
    with_group(kModel, [&](int, Rank &rank) {
        EXPECT_EQ(muon_optimizer_load(rank.opt, missing.c_str()), MUON_STATUS_IO_ERROR);
        EXPECT_NE(last_error().find("index.json"), std::string::npos) << last_error();
    });

    std::vector<Param> other = kModel;
    other.pop_back();
    with_group(other, [&](int, Rank &rank) {
        EXPECT_EQ(muon_optimizer_load(rank.opt, dir.c_str()), MUON_STATUS_CHECKPOINT_MISMATCH);
        EXPECT_NE(last_error().find("output.weight"), std::string::npos) << last_error();
    });

    const fs::path file = fs::path(dir) / "rank-00001.safetensors";
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x40;
    f.seekp(-5, std::ios::end);
    f.write(&byte, 1);
    f.close();
    with_group(kModel, [&](int r, Rank &rank) {
        rank.train(r, 1);
        std::vector<uint16_t> before = rank.params();
        EXPECT_EQ(muon_optimizer_load(rank.opt, dir.c_str()), MUON_STATUS_CHECKPOINT_CORRUPT);
        EXPECT_EQ(rank.params(), before) << "a failed load changes nothing";
    });
}
