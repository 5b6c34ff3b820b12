// The C API calls of a Megatron-style trainer with tensor, pipeline, data and expert
// parallelism: TP=2 × PP=2 × DP=2 = 8 ranks, here on host threads (on GPUs: muon::Comm::nccl of
// the corresponding ncclComm_t, and the rank's stream). Each rank has two optimizers — the
// dense params on the data-parallel group, its experts on the expert-data-parallel group
// (EP=2 over the DP ranks, so EDP=1) — stepped together with one clip. Exits non-zero unless
// every optimizer of every rank clips with the same coefficient, the norm is the norm of the
// whole model with each gradient counted once, and a NaN on one rank skips the step everywhere.
//
// Layout of world rank w: dp = w % 2, pp = (w / 2) % 2, tp = w / 4. Stage 0 holds the
// embedding and layer 0, stage 1 layer 1 and the output head, tied to the embedding; every
// layer has one expert per DP rank (expert number = dp).

#include <muon_opt.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int TP = 2, PP = 2, DP = 2, WORLD = TP * PP * DP;
constexpr int EP = DP, EDP = DP / EP;
constexpr int VOCAB = 96, HIDDEN = 32;

struct Param {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t flags;
};

// Rank (tp, pp)'s params: column-parallel fc1 (rows split) and row-parallel fc2 (columns split)
// are TP shards, orthogonalized whole (MUON_TP_MODE_DUPLICATED, Megatron's `--muon-tp-mode
// duplicated`: each owner gathers the other TP ranks' shards); the layer
// norm and fc2's bias are replicated on every TP rank (TP duplicates); the embedding (stage 0)
// and the output head (stage 1) are one tied weight, vocabulary-parallel over TP.
std::vector<Param> stage_params(int tp, int pp) {
    const uint32_t tp_duplicate = tp > 0 ? MUON_PARAM_FLAG_NORM_REPLICA : 0;
    std::vector<Param> params;
    const std::string layer = "layers." + std::to_string(pp) + ".";
    if (pp == 0) params.push_back({"embedding.weight", {VOCAB / TP, HIDDEN}, MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT});
    params.push_back({layer + "norm.weight", {HIDDEN}, tp_duplicate | MUON_PARAM_FLAG_NO_WEIGHT_DECAY});
    params.push_back({layer + "fc1.weight", {4 * HIDDEN / TP, HIDDEN}, MUON_PARAM_FLAG_TP_SHARD_ROWS});
    params.push_back({layer + "fc2.weight", {HIDDEN, 4 * HIDDEN / TP}, MUON_PARAM_FLAG_TP_SHARD_COLS});
    params.push_back({layer + "fc2.bias", {HIDDEN}, tp_duplicate | MUON_PARAM_FLAG_NO_WEIGHT_DECAY});
    // The last stage's copy of the tied embedding: the first stage counts it in the norm.
    if (pp == PP - 1) {
        params.push_back({"output.weight", {VOCAB / TP, HIDDEN},
                          MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT | MUON_PARAM_FLAG_NORM_REPLICA});
    }
    return params;
}

// Rank (tp, pp, dp)'s expert of its layer: expert dp, its matrices TP-sharded.
std::vector<Param> expert_params(int tp, int pp, int dp) {
    (void)tp;
    const std::string expert = "layers." + std::to_string(pp) + ".experts." + std::to_string(dp) + ".";
    return {{expert + "fc1.weight", {2 * HIDDEN / TP, HIDDEN}, 0}, {expert + "fc2.weight", {HIDDEN, 2 * HIDDEN / TP}, 0}};
}

int64_t numel(const Param &p) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    return n;
}

// The gradient a framework would hand over; equal on every copy of a replicated param (TP
// duplicates after the framework's TP all-reduce, the tied head after its embedding group).
float grad(int dp, int tp, int pp, const Param &p, int64_t i) {
    const bool duplicate = p.name.find("norm") != std::string::npos || p.name.find("bias") != std::string::npos;
    const bool tied = p.name == "embedding.weight" || p.name == "output.weight";
    const int owner_tp = duplicate ? 0 : tp, owner_pp = tied ? 0 : pp;
    const std::string key = tied ? std::string("tied") : p.name;
    uint64_t h = std::hash<std::string>{}(key) ^ (uint64_t(dp) * 7919u + uint64_t(owner_tp) * 104729u +
                                                   uint64_t(owner_pp) * 1299709u + uint64_t(i) * 31u);
    h *= 0x9E3779B97F4A7C15ull;
    return float((h >> 40) % 2001) / 1000.0f - 1.0f;
}

struct Outcome {
    muon_step_info_t clean, poisoned, expert_clean, expert_poisoned;
};

// Registers @p params (shapes and flags as given, f32) and returns their ids.
std::vector<uint32_t> register_params(muon::Optimizer &opt, const std::vector<Param> &params) {
    std::vector<uint32_t> ids;
    for (const Param &p : params) {
        muon_param_desc_t d = muon::param_desc(p.name.c_str(), {p.shape[0]});
        d.ndim = uint32_t(p.shape.size());
        for (size_t k = 0; k < p.shape.size(); ++k) d.shape[k] = p.shape[k];
        d.dtype = MUON_DTYPE_F32;
        d.flags = p.flags;
        ids.push_back(opt.add_param(d));
    }
    return ids;
}

// The backward of one optimizer's params: gradients written, hooks called in reverse order.
void backward(muon::Optimizer &opt, const std::vector<Param> &params, const std::vector<uint32_t> &ids, int dp,
              int tp, int pp, bool poison) {
    opt.zero_grad();
    for (size_t k = params.size(); k-- > 0;) {
        muon::ParamView v = opt.param_view(ids[k]);
        muon::Span<float> g = v.grad_span<float>();
        for (int64_t i = 0; i < numel(params[k]); ++i) g[size_t(i)] = grad(dp, tp, pp, params[k], i);
        if (poison && k == 0) g[0] = NAN;
        opt.grad_ready(ids[k]);
    }
}

}  // namespace

int main() {
    // Communicators, as a framework derives them from its world: one data-parallel group per
    // (tp, pp), one tensor-parallel group per (dp, pp), one expert-data-parallel group per
    // (tp, pp, expert), and a norm group over every rank (Megatron's model-parallel group × DP)
    // for each of the two optimizers (a communicator serves one optimizer).
    std::vector<std::vector<muon::Comm>> data_groups, tensor_groups, expert_groups;
    for (int g = 0; g < TP * PP; ++g) data_groups.push_back(muon::Comm::host_group(DP));
    for (int g = 0; g < DP * PP; ++g) tensor_groups.push_back(muon::Comm::host_group(TP));
    for (int g = 0; g < TP * PP * EP; ++g) expert_groups.push_back(muon::Comm::host_group(EDP));
    std::vector<muon::Comm> world = muon::Comm::host_group(WORLD), expert_world = muon::Comm::host_group(WORLD);
    std::vector<Outcome> outcomes(WORLD);
    std::vector<std::string> errors(WORLD);

    std::vector<std::thread> ranks;
    for (int w = 0; w < WORLD; ++w) {
        ranks.emplace_back([&, w] {
            try {
                const int dp = w % DP, pp = (w / DP) % PP, tp = w / (DP * PP);
                muon_config_t cfg = muon::default_config();
                cfg.clip_grad = 0.5f;
                cfg.vocab_size = VOCAB / TP;
                cfg.muon_tp_mode = MUON_TP_MODE_DUPLICATED;
                muon::Optimizer opt(cfg, data_groups[tp * PP + pp][dp]);
                muon::Optimizer experts(cfg, expert_groups[(tp * PP + pp) * EP + dp][0]);
                opt.set_norm_group(world[w]);  // 1. the clip and the skip are global
                experts.set_norm_group(expert_world[w]);
                opt.set_tp_group(tensor_groups[dp * PP + pp][tp]);  // TP shards gathered here
                const std::vector<Param> params = stage_params(tp, pp), expert = expert_params(tp, pp, dp);
                const std::vector<uint32_t> ids = register_params(opt, params);  // 2. duplicates flagged
                const std::vector<uint32_t> expert_ids = register_params(experts, expert);
                opt.finalize();
                experts.finalize();
                const muon_step_args_t args = muon::step_args(0.02f, 0.1f, 3e-4f, 0.1f);
                for (bool poison : {false, true}) {  // 3. the usual hooks, then one shared step
                    backward(opt, params, ids, dp, tp, pp, poison && w == WORLD - 1);
                    backward(experts, expert, expert_ids, dp, tp, pp, false);
                    muon::step_shared({opt, experts}, {args, args});
                    (poison ? outcomes[w].poisoned : outcomes[w].clean) = opt.step_info();
                    (poison ? outcomes[w].expert_poisoned : outcomes[w].expert_clean) = experts.step_info();
                }
            } catch (const std::exception &e) {
                errors[w] = e.what();
            }
        });
    }
    for (std::thread &t : ranks) t.join();
    for (int w = 0; w < WORLD; ++w) {
        if (!errors[w].empty()) {
            std::fprintf(stderr, "rank %d: %s\n", w, errors[w].c_str());
            return 1;
        }
    }

    // The norm of the whole model, each gradient counted once, by hand.
    double total = 0.0;
    for (int tp = 0; tp < TP; ++tp) {
        for (int pp = 0; pp < PP; ++pp) {
            for (const Param &p : stage_params(tp, pp)) {
                if (p.flags & MUON_PARAM_FLAG_NORM_REPLICA) continue;
                for (int64_t i = 0; i < numel(p); ++i) {
                    float sum = 0.0f;
                    for (int dp = 0; dp < DP; ++dp) sum += grad(dp, tp, pp, p, i);
                    total += double(sum) * double(sum);
                }
            }
        }
    }
    double expert_total = 0.0;
    for (int tp = 0; tp < TP; ++tp) {
        for (int pp = 0; pp < PP; ++pp) {
            for (int dp = 0; dp < DP; ++dp) {
                for (const Param &p : expert_params(tp, pp, dp)) {
                    for (int64_t i = 0; i < numel(p); ++i) {
                        const double g = grad(dp, tp, pp, p, i);  // EDP = 1: one rank's gradient
                        expert_total += g * g;
                    }
                }
            }
        }
    }
    const double expected = std::sqrt(total / (DP * DP) + expert_total / (EDP * EDP));
    bool ok = true;
    for (int w = 0; w < WORLD; ++w) {
        const Outcome &o = outcomes[w];
        for (const muon_step_info_t &clean : {o.clean, o.expert_clean}) {
            ok &= clean.clip_coef == outcomes[0].clean.clip_coef && clean.grad_norm == outcomes[0].clean.grad_norm;
        }
        ok &= std::fabs(o.clean.grad_norm - expected) <= 1e-9 * expected;
        for (const muon_step_info_t &poisoned : {o.poisoned, o.expert_poisoned}) {
            ok &= poisoned.skipped != 0 && poisoned.step == 1;
        }
    }
    std::printf("%d ranks x 2 optimizers: grad norm %.6f (by hand %.6f), clip %.6f on every one; a NaN on rank %d skipped the step on %s\n",
                WORLD, outcomes[0].clean.grad_norm, expected, double(outcomes[0].clean.clip_coef), WORLD - 1,
                ok ? "every rank" : "NOT every rank");
    return ok ? 0 : 1;
}
