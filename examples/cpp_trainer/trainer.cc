// cpp_trainer — the integration guide, in code.
//
// A complete C++ trainer that uses libmuon_opt through include/muon_opt.hpp (the RAII layer
// over muon_opt.h) only. It trains a tiny language model on 4 data-parallel ranks, each rank a
// std::thread on the library's host backend (an in-process communicator: the CPU executable
// specification of the NCCL/CUDA path, with the same plan, schedule and numerics).
//
// Read it top to bottom; the numbered comments are the steps of an integration:
//   1. configure the optimizer                          (muon::default_config)
//   2. one communicator per rank                        (muon::Comm::host_group / Comm::nccl)
//   3. register every param in forward order, with its routing flags and tie group
//                                                       (Optimizer::add_param)
//   4. finalize — collective — and take the param views (Optimizer::finalize, param_view):
//      the library now owns the param and grad storage; the framework computes on the views
//   5. every iteration: zero_grad; forward with wait_params as the pre-hook of each param;
//      backward accumulating into view.grad and calling grad_ready when a param's gradient
//      is complete; step
//   6. checkpoint: save (collective) mid-run, load (collective) to resume
//   7. teardown: optimizer before communicator
//
// On a GPU the differences are confined to steps 2 and 3: Comm::nccl(your ncclComm_t),
// Optimizer(cfg, comm, your cudaStream_t), init_data a device pointer, and the view pointers
// are device memory your kernels read and write on that stream.
//
// The program exits non-zero if the held-out loss does not fall to below half its initial
// value, if the ranks' params differ by a single bit, if the tied copies drift apart, or if
// resuming from the mid-run checkpoint does not replay the second half bit for bit.
//
// The model: next-token prediction of a fixed random map y = perm[x] over a 96-token
// vocabulary, with an input embedding tied to the output head and one residual MLP block:
//   e = E[x];  z = tanh(W1·e + b1);  u = e + W2·z + b2;  logits = E_out·u;  loss = CE(logits, y)
#include "muon_opt.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>  // getpid, for a private checkpoint directory

namespace {

constexpr int kRanks = 4;
constexpr int kVocab = 96;
constexpr int kDim = 32;
constexpr int kHidden = 64;
constexpr int kBatch = 32;  // per rank per step
constexpr int kSteps = 60;
constexpr int kCheckpointStep = 30;  // save after this many steps
constexpr int kEvalBatch = 256;

// ---------------------------------------------------------------------------------------------
// The framework's own pieces, which know nothing about the optimizer.
// ---------------------------------------------------------------------------------------------

/// SplitMix64: the same stream on every rank for the same seed.
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1u << 24) * 2.0f - 1.0f; }
    int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
};

/// The task: a fixed random permutation of the vocabulary.
std::vector<int> make_task() {
    std::vector<int> perm(kVocab);
    for (int i = 0; i < kVocab; ++i) perm[i] = i;
    Rng rng{12345};
    for (int i = kVocab - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
    return perm;
}

/// The framework's param table, in forward order. Registration order is forward order.
enum ParamId : uint32_t { kEmbedding, kFc1W, kFc1B, kFc2W, kFc2B, kHead, kNumParams };

struct ParamInfo {
    const char *name;
    std::vector<int64_t> shape;
    uint32_t flags;
    uint32_t tie_group;
};

// Routing is decided by the library from shape and flags, and verified:
//  - 2-D hidden matrices (fc1, fc2) go to Muon, each owned whole by one rank;
//  - the embedding and the output head are flagged EMBEDDING_OR_OUTPUT, so they go to AdamW
//    (never to Muon, even though they are 2-D);
//  - 1-D biases go to AdamW, not decayed: the default weight_decay_rule is Megatron-LM's
//    (1-D params and *.bias spared); NO_WEIGHT_DECAY says so explicitly, WEIGHT_DECAY would
//    decay one anyway.
//  - This trainer stores the tied embedding twice, as a pipeline-parallel framework does with
//    the embedding on its first stage and the head on its last (or a multi-token-prediction
//    stage with its own copy). Both copies share tie_group 1, and the library refuses
//    registration if they would route differently (e.g. one of them not flagged): the error
//    names both params. A framework that holds one tensor for both uses registers it once.
const std::vector<ParamInfo> kParams = {
    {"embedding.weight", {kVocab, kDim}, MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT, 1},
    {"block.fc1.weight", {kHidden, kDim}, 0, 0},
    {"block.fc1.bias", {kHidden}, MUON_PARAM_FLAG_NO_WEIGHT_DECAY, 0},
    {"block.fc2.weight", {kDim, kHidden}, 0, 0},
    {"block.fc2.bias", {kDim}, MUON_PARAM_FLAG_NO_WEIGHT_DECAY, 0},
    {"output.weight", {kVocab, kDim}, MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT, 1},
};

size_t numel(const ParamInfo &p) {
    size_t n = 1;
    for (int64_t d : p.shape) n *= static_cast<size_t>(d);
    return n;
}

/// The framework's initial values (identical on every rank; tied copies equal).
std::vector<std::vector<float>> initial_values() {
    std::vector<std::vector<float>> init(kNumParams);
    Rng rng{2024};
    auto uniform = [&](size_t n, float scale) {
        std::vector<float> v(n);
        for (auto &x : v) x = scale * rng.uniform();
        return v;
    };
    init[kEmbedding] = uniform(numel(kParams[kEmbedding]), 0.2f);
    init[kFc1W] = uniform(numel(kParams[kFc1W]), std::sqrt(3.0f / kDim));
    init[kFc1B] = std::vector<float>(kHidden, 0.0f);
    init[kFc2W] = uniform(numel(kParams[kFc2W]), std::sqrt(3.0f / kHidden));
    init[kFc2B] = std::vector<float>(kDim, 0.0f);
    init[kHead] = init[kEmbedding];
    return init;
}

/// Forward activations of one batch, kept for backward.
struct Activations {
    std::vector<int> x, y;
    std::vector<float> e, z, u, probs;  // [B,D] [B,H] [B,D] [B,V]
};

/// The framework's hooks into the optimizer: its forward calls pre_forward(param) before a
/// param's first use, its backward calls grad_done(param) once the param's gradient is
/// complete. In a module-based framework these are the forward pre-hooks and the
/// post-accumulate-grad hooks; here the model calls them by hand.
struct Hooks {
    virtual void pre_forward(uint32_t param) = 0;
    virtual void grad_done(uint32_t param) = 0;
    virtual ~Hooks() = default;
};

/// The model computes on spans: parameter storage `w[p]` and gradient storage `g[p]` are the
/// library's buffers (the param views), exactly like Megatron's param_data / main_grad.
struct Model {
    std::vector<muon::Span<float>> w, g;

    float forward(Activations &a, Hooks *hooks) const {
        const int batch = static_cast<int>(a.x.size());
        a.e.assign(size_t(batch) * kDim, 0.0f);
        a.z.assign(size_t(batch) * kHidden, 0.0f);
        a.u.assign(size_t(batch) * kDim, 0.0f);
        a.probs.assign(size_t(batch) * kVocab, 0.0f);
        auto use = [&](uint32_t p) {
            if (hooks) hooks->pre_forward(p);
        };
        use(kEmbedding);
        for (int b = 0; b < batch; ++b)
            std::copy_n(&w[kEmbedding][size_t(a.x[b]) * kDim], kDim, &a.e[size_t(b) * kDim]);
        use(kFc1W);
        use(kFc1B);
        for (int b = 0; b < batch; ++b)
            for (int h = 0; h < kHidden; ++h) {
                float s = w[kFc1B][h];
                for (int d = 0; d < kDim; ++d) s += w[kFc1W][size_t(h) * kDim + d] * a.e[size_t(b) * kDim + d];
                a.z[size_t(b) * kHidden + h] = std::tanh(s);
            }
        use(kFc2W);
        use(kFc2B);
        for (int b = 0; b < batch; ++b)
            for (int d = 0; d < kDim; ++d) {
                float s = a.e[size_t(b) * kDim + d] + w[kFc2B][d];
                for (int h = 0; h < kHidden; ++h) s += w[kFc2W][size_t(d) * kHidden + h] * a.z[size_t(b) * kHidden + h];
                a.u[size_t(b) * kDim + d] = s;
            }
        use(kHead);
        double loss = 0.0;
        for (int b = 0; b < batch; ++b) {
            float *p = &a.probs[size_t(b) * kVocab];
            float mx = -INFINITY;
            for (int v = 0; v < kVocab; ++v) {
                float s = 0.0f;
                for (int d = 0; d < kDim; ++d) s += w[kHead][size_t(v) * kDim + d] * a.u[size_t(b) * kDim + d];
                p[v] = s;
                mx = std::max(mx, s);
            }
            double sum = 0.0;
            for (int v = 0; v < kVocab; ++v) sum += (p[v] = std::exp(p[v] - mx));
            for (int v = 0; v < kVocab; ++v) p[v] = static_cast<float>(p[v] / sum);
            loss -= std::log(std::max(p[a.y[b]], 1e-30f));
        }
        return static_cast<float>(loss / batch);
    }

    /// Accumulates d(mean loss)/d(param) into g, layer by layer in reverse order.
    void backward(const Activations &a, Hooks &hooks) const {
        const int batch = static_cast<int>(a.x.size());
        std::vector<float> du(size_t(batch) * kDim, 0.0f), dz(kHidden), de(kDim);
        // Output head.
        for (int b = 0; b < batch; ++b)
            for (int v = 0; v < kVocab; ++v) {
                float dl = (a.probs[size_t(b) * kVocab + v] - (v == a.y[b] ? 1.0f : 0.0f)) / batch;
                for (int d = 0; d < kDim; ++d) {
                    g[kHead][size_t(v) * kDim + d] += dl * a.u[size_t(b) * kDim + d];
                    du[size_t(b) * kDim + d] += dl * w[kHead][size_t(v) * kDim + d];
                }
            }
        // The head is tied: its gradient is complete only once the embedding's is (below).
        // MLP block.
        for (int b = 0; b < batch; ++b) {
            const float *dub = &du[size_t(b) * kDim];
            const float *zb = &a.z[size_t(b) * kHidden];
            const float *eb = &a.e[size_t(b) * kDim];
            std::fill(dz.begin(), dz.end(), 0.0f);
            for (int d = 0; d < kDim; ++d) {
                g[kFc2B][d] += dub[d];
                for (int h = 0; h < kHidden; ++h) {
                    g[kFc2W][size_t(d) * kHidden + h] += dub[d] * zb[h];
                    dz[h] += w[kFc2W][size_t(d) * kHidden + h] * dub[d];
                }
            }
            std::copy_n(dub, kDim, de.begin());  // residual path
            for (int h = 0; h < kHidden; ++h) {
                float da = dz[h] * (1.0f - zb[h] * zb[h]);
                g[kFc1B][h] += da;
                for (int d = 0; d < kDim; ++d) {
                    g[kFc1W][size_t(h) * kDim + d] += da * eb[d];
                    de[d] += w[kFc1W][size_t(h) * kDim + d] * da;
                }
            }
            for (int d = 0; d < kDim; ++d) g[kEmbedding][size_t(a.x[b]) * kDim + d] += de[d];
        }
        // The block's gradients are complete (a layer-wise backward would report fc2 before
        // computing fc1's): each bucket's reduction can start while backward goes on.
        hooks.grad_done(kFc2W);
        hooks.grad_done(kFc2B);
        hooks.grad_done(kFc1W);
        hooks.grad_done(kFc1B);
        // Tied weights: both copies get the sum of both uses, so their AdamW updates are
        // identical and they stay equal bit for bit (Megatron all-reduces the embedding group's
        // gradients the same way). Then both gradients are complete.
        for (size_t i = 0; i < g[kHead].size(); ++i) g[kHead][i] = g[kEmbedding][i] = g[kHead][i] + g[kEmbedding][i];
        hooks.grad_done(kHead);
        hooks.grad_done(kEmbedding);
    }
};

void sample(const std::vector<int> &perm, uint64_t seed, int batch, Activations &a) {
    Rng rng{seed};
    a.x.resize(size_t(batch));
    a.y.resize(size_t(batch));
    for (int b = 0; b < batch; ++b) {
        a.x[b] = rng.below(kVocab);
        a.y[b] = perm[size_t(a.x[b])];
    }
}

// ---------------------------------------------------------------------------------------------
// The integration: everything below is what a trainer adds to use the library.
// ---------------------------------------------------------------------------------------------

/// The hooks of one rank call the optimizer.
struct OptimizerHooks final : Hooks {
    muon::Optimizer &opt;
    const std::vector<muon::ParamView> &views;
    OptimizerHooks(muon::Optimizer &o, const std::vector<muon::ParamView> &v) : opt(o), views(v) {}

    // Forward pre-hook: order this use after the param collective of the param's bucket.
    // After step() with overlap_param_gather=1 the updated params arrive bucket by bucket
    // while the next forward runs; on the host backend and on a GPU stream alike, this call
    // is what makes the param's storage safe to read. Waiting on a bucket twice is harmless.
    void pre_forward(uint32_t param) override { opt.wait_params(views[param].bucket); }

    // Backward hook: the param's gradient is fully accumulated. With overlap_grad_reduce=1
    // the bucket's gradient collective (reduce to the owner rank, or reduce-scatter for
    // AdamW shards) starts as soon as the last param of the bucket is ready, overlapping the
    // rest of backward. After this call the framework must not touch that gradient again.
    void grad_done(uint32_t param) override { opt.grad_ready(param); }
};

struct RankResult {
    float initial_eval = 0.0f, final_eval = 0.0f;
    std::vector<float> final_params;  // every param, registration order
    bool tied_equal = false;
    bool resume_replays = false;  // load(checkpoint) + the same steps gave the same params
};

std::vector<float> all_params(const Model &model) {
    std::vector<float> out;
    for (const auto &w : model.w) out.insert(out.end(), w.begin(), w.end());
    return out;
}

std::mutex print_mutex;

RankResult train_rank(const muon::Comm &comm, const std::vector<int> &perm, const std::string &checkpoint_dir) {
    const uint32_t rank = comm.rank();

    // 1. Configure. muon::default_config() is muon_config_init(): defaults for every field.
    muon_config_t cfg = muon::default_config();
    cfg.bucket_size = 2048;                     // small buckets, so this toy model has several
    cfg.muon_ns_precision = MUON_NS_PRECISION_F32;
    cfg.clip_grad = 1.0f;                       // global grad-norm clipping (the default)
    cfg.collective_timeout_ms = 20000;          // a rank that dies fails the others quickly
    cfg.vocab_size = kVocab;                    // catches an untagged embedding-shaped matrix
    muon::validate(cfg);                        // optional: create() validates too

    // 2. One optimizer per rank, on that rank's communicator. On a GPU: Comm::nccl(nccl_comm)
    //    and Optimizer(cfg, comm, stream) with the cudaStream_t your forward/backward use.
    muon::Optimizer opt(cfg, comm);

    // 3. Register every param in forward order. The library copies init_data (high-precision
    //    initial values) into its own param storage and fp32 masters; from now on it owns the
    //    weights. dtype F32 keeps this CPU example simple; bf16 is the default for models.
    const auto init = initial_values();
    for (uint32_t p = 0; p < kNumParams; ++p) {
        const ParamInfo &info = kParams[p];
        muon_param_desc_t d;
        muon_param_desc_init(&d);               // or muon::param_desc(name, {dims...})
        d.name = info.name;
        d.ndim = static_cast<uint32_t>(info.shape.size());
        std::copy(info.shape.begin(), info.shape.end(), d.shape);
        d.dtype = MUON_DTYPE_F32;
        d.flags = info.flags;
        d.tie_group = info.tie_group;
        d.init_data = init[p].data();
        d.init_dtype = MUON_DTYPE_F32;
        uint32_t id = opt.add_param(d);         // ids are registration indices
        if (id != p) throw std::runtime_error("unexpected param id");
    }

    // 4. Finalize (collective: every rank calls it; it plans and checks the ranks agree), then
    //    take each param's view: its bucket, its route and owner, and the data/grad storage
    //    the framework computes on.
    opt.finalize();
    std::vector<muon::ParamView> views;
    Model model;
    for (uint32_t p = 0; p < kNumParams; ++p) {
        views.push_back(opt.param_view(p));
        model.w.push_back(views[p].data_span<float>());
        model.g.push_back(views[p].grad_span<float>());  // grad_dtype F32 (the default)
    }
    if (rank == 0) {
        std::lock_guard<std::mutex> lock(print_mutex);
        std::printf("%-18s %-6s %6s %6s\n", "param", "route", "bucket", "owner");
        for (uint32_t p = 0; p < kNumParams; ++p)
            std::printf("%-18s %-6s %6u %6d\n", kParams[p].name,
                        views[p].route == MUON_ROUTE_MUON ? "muon" : "adamw", views[p].bucket, views[p].owner);
    }
    OptimizerHooks hooks(opt, views);

    RankResult result;
    Activations eval;
    sample(perm, 777, kEvalBatch, eval);        // held-out batch, same on every rank
    result.initial_eval = model.forward(eval, &hooks);

    // 5. The training loop. Each rank draws its own batch (data parallelism); the library
    //    averages the gradients over ranks, so every rank supplies its local mean gradient.
    const muon_step_args_t args = muon::step_args(/*lr*/ 0.02f, /*weight_decay*/ 0.01f,
                                                  /*adam_lr*/ 0.01f, /*adam_weight_decay*/ 0.0f);
    Activations act;
    auto train = [&](int first, int last, bool print) {
        for (int step = first; step < last; ++step) {
            opt.zero_grad();                                 // before accumulating
            sample(perm, (uint64_t(step) << 8) | rank, kBatch, act);
            float loss = model.forward(act, &hooks);         // wait_params as pre-hook
            model.backward(act, hooks);                      // grad_ready from backward
            muon_step_info_t info = opt.step(args);          // clip, Muon, AdamW, param sync
            if (info.skipped) throw std::runtime_error("step skipped on a non-finite gradient");
            if (print && rank == 0 && (step % 10 == 0 || step == last - 1)) {
                std::lock_guard<std::mutex> lock(print_mutex);
                std::printf("step %3llu  loss(rank 0) %.4f  grad_norm %.4f  clip %.3f\n",
                            static_cast<unsigned long long>(info.step), loss, info.grad_norm, info.clip_coef);
            }
        }
    };
    train(0, kCheckpointStep, true);

    // 6. Checkpoint. save() is collective (every rank, same directory); it waits for the
    //    in-flight param collectives itself and writes each rank's fp32 masters and optimizer
    //    moments. The framework saves its own state (here: the step counter that seeds the
    //    data) beside it. load() is collective too, may run at another dp size or layout, and
    //    re-synchronizes every rank's params from the loaded masters.
    opt.save(checkpoint_dir);
    train(kCheckpointStep, kSteps, true);

    // The next forward waits for the last step's param collectives through its pre-hooks;
    // after it every bucket has been waited for and the params can be read.
    result.final_eval = model.forward(eval, &hooks);
    result.final_params = all_params(model);
    result.tied_equal = std::equal(model.w[kHead].begin(), model.w[kHead].end(), model.w[kEmbedding].begin());

    // Resume from the checkpoint and replay the second half: same data, same params.
    opt.load(checkpoint_dir);
    train(kCheckpointStep, kSteps, false);
    model.forward(eval, &hooks);
    result.resume_replays = all_params(model) == result.final_params;

    // 7. Teardown: the optimizer (with its buffers: the views die here) before the
    //    communicator. close() reports a teardown error; the destructor would drop it.
    opt.synchronize();
    opt.close();
    return result;
}

/// Every failing call throws muon::Error with the library's status and message. Here: a tied
/// copy that is not flagged EMBEDDING_OR_OUTPUT would route to Muon while its twin routes to
/// AdamW, and registration refuses it, naming both params. Returns whether that happened.
bool registration_errors_are_exceptions() {
    std::vector<muon::Comm> group = muon::Comm::host_group(1);
    muon::Optimizer scratch(muon::default_config(), group[0]);
    muon_param_desc_t embedding = muon::param_desc("embedding.weight", {kVocab, kDim});
    embedding.flags = MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT;
    embedding.tie_group = 1;
    scratch.add_param(embedding);
    muon_param_desc_t head = muon::param_desc("output.weight", {kVocab, kDim});
    head.tie_group = 1;  // flag forgotten
    try {
        scratch.add_param(head);
    } catch (const muon::Error &e) {
        std::printf("expected error: %s\n", e.what());
        return e.status() == MUON_STATUS_ROUTING_CONFLICT;
    }
    return false;
}

int run() {
    std::printf("libmuon_opt %u (header %d), %d host ranks on threads\n", muon::version(), MUON_VERSION_CODE, kRanks);
    if (!registration_errors_are_exceptions()) {
        std::fprintf(stderr, "FAIL: an untied-route registration was accepted\n");
        return 1;
    }
    const std::vector<int> perm = make_task();
    namespace fs = std::filesystem;
    const fs::path checkpoint_dir = fs::temp_directory_path() / ("muon_cpp_trainer." + std::to_string(::getpid()));
    struct RemoveOnExit {
        fs::path dir;
        ~RemoveOnExit() {
            std::error_code ec;
            fs::remove_all(dir, ec);
        }
    } cleanup{checkpoint_dir};

    // 2. One communicator per rank; declared before (so destroyed after) the optimizers.
    std::vector<muon::Comm> comms = muon::Comm::host_group(kRanks);

    std::vector<RankResult> results(kRanks);
    std::vector<std::exception_ptr> errors(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
        threads.emplace_back([&, r] {
            try {
                results[r] = train_rank(comms[r], perm, checkpoint_dir.string());
            } catch (...) {
                errors[r] = std::current_exception();
            }
        });
    for (auto &t : threads) t.join();

    int failures = 0;
    for (int r = 0; r < kRanks; ++r) {
        if (!errors[r]) continue;
        try {
            std::rethrow_exception(errors[r]);
        } catch (const muon::Error &e) {
            std::fprintf(stderr, "rank %d: muon::Error %s\n", r, e.what());  // e.status() is the code
        } catch (const std::exception &e) {
            std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        }
        ++failures;
    }
    if (failures) return 1;

    const RankResult &r0 = results[0];
    std::printf("held-out loss: %.4f -> %.4f (ln %d = %.4f)\n", r0.initial_eval, r0.final_eval, kVocab,
                std::log(static_cast<double>(kVocab)));
    for (int r = 1; r < kRanks; ++r) {
        const std::vector<float> &mine = results[r].final_params, &first = r0.final_params;
        if (mine.size() != first.size() || std::memcmp(mine.data(), first.data(), first.size() * sizeof(float)) != 0) {
            std::fprintf(stderr, "FAIL: rank %d params differ from rank 0\n", r);
            ++failures;
        }
        if (results[r].final_eval != r0.final_eval) {
            std::fprintf(stderr, "FAIL: rank %d held-out loss %.6f differs from rank 0's %.6f\n", r,
                         results[r].final_eval, r0.final_eval);
            ++failures;
        }
    }
    for (int r = 0; r < kRanks; ++r) {
        if (!results[r].tied_equal) {
            std::fprintf(stderr, "FAIL: rank %d tied copies embedding.weight/output.weight differ\n", r);
            ++failures;
        }
        if (!results[r].resume_replays) {
            std::fprintf(stderr, "FAIL: rank %d resumed from the checkpoint to different params\n", r);
            ++failures;
        }
    }
    if (!(r0.final_eval < 0.5f * r0.initial_eval)) {
        std::fprintf(stderr, "FAIL: training did not halve the held-out loss\n");
        ++failures;
    }
    if (failures) return 1;
    std::printf("OK: loss reduced, %d ranks bitwise identical, tied copies equal, resume replays bitwise\n", kRanks);
    return 0;
}

}  // namespace

int main() {
    try {
        return run();
    } catch (const muon::Error &e) {
        std::fprintf(stderr, "muon::Error %s\n", e.what());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "%s\n", e.what());
    }
    return 1;
}
