// muon_opt.hpp — hand-written, header-only C++17 layer over the C API in muon_opt.h.
//
// What it adds, and nothing else:
//   - muon::Error (a std::runtime_error) thrown for every non-success status, carrying the
//     status and muon_last_error_message() of the failing call;
//   - move-only RAII owners of the C handles: muon::Comm (muon_comm_t) and muon::Optimizer
//     (muon_optimizer_t);
//   - muon::Span<T>, a {data, size} view (C++17 has no std::span), and muon::ParamView, the C
//     muon_param_view_t with typed spans over its data and grad storage;
//   - checkpoint save/load (muon_optimizer_save / muon_optimizer_load) as Optimizer methods;
//   - small initialisers for the C structs (config, param description, step arguments) and
//     throwing forms of the host utilities (Newton–Schulz, MXFP8 scale shape and quantize).
// Every rule (validation, routing, planning, threading, streams) is the C API's; read the
// contracts in muon_opt.h. The owners release their handle in the destructor; a destructor
// never throws, so a teardown error there is dropped (call close() to see it).
//
// Order of destruction: an Optimizer must be destroyed before the Comm it was created on.
// Declare the Comm first (destructors run in reverse order) or call close() explicitly.
#ifndef MUON_OPT_HPP
#define MUON_OPT_HPP

#include "muon_opt.h"

#include <array>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace muon {

/// A failed `muon_*` call: status() is the muon_status_t, what() is
/// "<status string> (<code>): <muon_last_error_message()>".
class Error : public std::runtime_error {
public:
    Error(muon_status_t status, const std::string &message)
        : std::runtime_error(std::string(muon_status_string(static_cast<uint32_t>(status))) + " (" +
                             std::to_string(static_cast<uint32_t>(status)) + "): " + message),
          status_(status) {}

    muon_status_t status() const noexcept { return status_; }

private:
    muon_status_t status_;
};

/// Throws muon::Error unless @p status is MUON_STATUS_SUCCESS. Call it right after the C call,
/// on the same thread: the message is thread-local and the next failing call replaces it.
inline void check(muon_status_t status) {
    if (status != MUON_STATUS_SUCCESS) throw Error(status, muon_last_error_message());
}

/// A non-owning view of @p size contiguous elements of T.
template <class T>
struct Span {
    T *ptr = nullptr;
    std::size_t len = 0;

    constexpr Span() noexcept = default;
    constexpr Span(T *data, std::size_t size) noexcept : ptr(data), len(size) {}
    template <class U, class = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
    Span(std::vector<U> &v) noexcept : ptr(v.data()), len(v.size()) {}
    template <class U, class = std::enable_if_t<std::is_convertible_v<const U (*)[], T (*)[]>>>
    Span(const std::vector<U> &v) noexcept : ptr(v.data()), len(v.size()) {}
    template <class U, class = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
    constexpr Span(Span<U> other) noexcept : ptr(other.data()), len(other.size()) {}

    constexpr T *data() const noexcept { return ptr; }
    constexpr std::size_t size() const noexcept { return len; }
    constexpr bool empty() const noexcept { return len == 0; }
    constexpr T &operator[](std::size_t i) const noexcept { return ptr[i]; }
    constexpr T *begin() const noexcept { return ptr; }
    constexpr T *end() const noexcept { return ptr + len; }
};

/// Library version as MAJOR*10000 + MINOR*100 + PATCH (compare with MUON_VERSION_CODE).
inline uint32_t version() noexcept { return muon_get_version(); }

/// Whether a CUDA driver and a device are usable (never throws).
inline bool cuda_available() noexcept { return muon_cuda_available(); }

/// muon_config_init() defaults; change fields, then pass to Optimizer.
inline muon_config_t default_config() noexcept {
    muon_config_t cfg;
    muon_config_init(&cfg);
    return cfg;
}

/// A declared data-parallel ring for muon_config_t.network / expert_network: per-hop latency
/// (µs) and bus bandwidth (GB/s), as nccl-tests measures them. The library checks the figures
/// when it reads the config (finite, latency >= 0, bandwidth > 0), naming the field.
inline muon_network_t network(double hop_latency_us, double bus_bandwidth_gbps) noexcept {
    muon_network_t n{};
    n.declared = 1;
    n.hop_latency_us = hop_latency_us;
    n.bus_bandwidth_gbps = bus_bandwidth_gbps;
    return n;
}

/// Sets @p cfg's Newton–Schulz coefficients to the caller's table: muon_coefficient_set
/// MUON_COEFFICIENTS_CUSTOM, muon_custom_coefficient_steps the number of (a, b, c) triples and
/// muon_custom_coefficients the triples. Throws muon::Error (MUON_STATUS_OUT_OF_RANGE) for an
/// empty table or one of more than MUON_MAX_CUSTOM_COEFFICIENTS triples; the library checks
/// the values (finite) when it reads the config.
inline void set_custom_coefficients(muon_config_t &cfg, std::initializer_list<std::array<float, 3>> table) {
    if (table.size() == 0 || table.size() > MUON_MAX_CUSTOM_COEFFICIENTS) {
        throw Error(MUON_STATUS_OUT_OF_RANGE,
                    "muon_custom_coefficient_steps: " + std::to_string(table.size()) + " triples is outside 1..=" +
                        std::to_string(MUON_MAX_CUSTOM_COEFFICIENTS));
    }
    cfg.muon_coefficient_set = MUON_COEFFICIENTS_CUSTOM;
    cfg.muon_custom_coefficient_steps = static_cast<uint32_t>(table.size());
    size_t i = 0;
    for (const auto &triple : table) {
        for (float value : triple) {
            cfg.muon_custom_coefficients[i++] = value;
        }
    }
}

/// Throws muon::Error naming the first invalid field or combination of @p cfg.
inline void validate(const muon_config_t &cfg) { check(muon_config_validate(&cfg)); }

/// muon_param_desc_init() defaults with @p name and @p shape set (1..MUON_MAX_DIMS dims).
/// @p name is borrowed: it must stay valid until the add_param call that reads it.
inline muon_param_desc_t param_desc(const char *name, std::initializer_list<int64_t> shape) {
    if (shape.size() == 0 || shape.size() > MUON_MAX_DIMS)
        throw std::invalid_argument("muon::param_desc: a shape has 1 to MUON_MAX_DIMS dimensions");
    muon_param_desc_t d;
    muon_param_desc_init(&d);
    d.name = name;
    d.ndim = static_cast<uint32_t>(shape.size());
    std::size_t i = 0;
    for (int64_t dim : shape) d.shape[i++] = dim;
    return d;
}

/// Step arguments with struct_size set.
inline muon_step_args_t step_args(float lr, float weight_decay, float adam_lr, float adam_weight_decay) noexcept {
    muon_step_args_t a{};
    a.struct_size = sizeof a;
    a.lr = lr;
    a.weight_decay = weight_decay;
    a.adam_lr = adam_lr;
    a.adam_weight_decay = adam_weight_decay;
    return a;
}

/// @p args with the step's Muon momentum in place of the config's (a scheduler's value, e.g. a
/// momentum warmup): MUON_STEP_OVERRIDE_MUON_MOMENTUM.
inline muon_step_args_t with_muon_momentum(muon_step_args_t args, float momentum) noexcept {
    args.overrides |= MUON_STEP_OVERRIDE_MUON_MOMENTUM;
    args.muon_momentum = momentum;
    return args;
}

/// @p args with the step's AdamW betas in place of the config's (e.g. a cycled β1):
/// MUON_STEP_OVERRIDE_ADAM_BETA1 and _BETA2.
inline muon_step_args_t with_adam_betas(muon_step_args_t args, float beta1, float beta2) noexcept {
    args.overrides |= MUON_STEP_OVERRIDE_ADAM_BETA1 | MUON_STEP_OVERRIDE_ADAM_BETA2;
    args.adam_beta1 = beta1;
    args.adam_beta2 = beta2;
    return args;
}

/// @p args with the step's AdamW ε in place of the config's: MUON_STEP_OVERRIDE_ADAM_EPS.
inline muon_step_args_t with_adam_eps(muon_step_args_t args, float eps) noexcept {
    args.overrides |= MUON_STEP_OVERRIDE_ADAM_EPS;
    args.adam_eps = eps;
    return args;
}

/// @p args with the learning rate of the params flagged MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT in
/// place of adam_lr (Megatron-LM's `--decoupled-lr`, scheduled by the caller like `--lr`, down
/// to `--decoupled-min-lr`): MUON_STEP_OVERRIDE_DECOUPLED_LR.
inline muon_step_args_t with_decoupled_lr(muon_step_args_t args, float lr) noexcept {
    args.overrides |= MUON_STEP_OVERRIDE_DECOUPLED_LR;
    args.decoupled_lr = lr;
    return args;
}

/// Shapes of the E8M0 scale arrays of a [rows, cols] MXFP8 tensor:
/// {rowwise rows, rowwise cols, columnwise rows, columnwise cols}.
/// One attention matrix to QK-clip (muon_qk_clip_t): @p kind is MUON_QK_KIND_*, @p max_logits
/// @p num_heads floats (a device pointer on the cuda backend, host on the host backend); set
/// rope_dim / v_head_dim on the result for the MLA kinds.
inline muon_qk_clip_t qk_clip_desc(uint32_t param_id, uint32_t kind, uint32_t num_heads, uint32_t num_query_groups,
                                   uint32_t head_dim, const float *max_logits) noexcept {
    muon_qk_clip_t c{};
    muon_qk_clip_init(&c);
    c.param_id = param_id;
    c.kind = kind;
    c.num_heads = num_heads;
    c.num_query_groups = num_query_groups;
    c.head_dim = head_dim;
    c.max_logits = max_logits;
    return c;
}

inline std::array<uint64_t, 4> mxfp8_scale_shape(uint64_t rows, uint64_t cols) {
    std::array<uint64_t, 4> shapes{};
    check(muon_mxfp8_scale_shape(rows, cols, shapes.data()));
    return shapes;
}

/// The library's host MXFP8 quantization (TransformerEngine bit-exact) of a [rows, cols]
/// row-major array of @p input_dtype (MUON_DTYPE_BF16 or _F32) into the four output spans.
inline void mxfp8_quantize_host(const void *input, uint32_t input_dtype, uint64_t rows, uint64_t cols,
                                uint32_t scale_layout, Span<uint8_t> rowwise_data, Span<uint8_t> rowwise_scales,
                                Span<uint8_t> colwise_data, Span<uint8_t> colwise_scales) {
    const auto shapes = mxfp8_scale_shape(rows, cols);
    if (rowwise_data.size() != rows * cols || colwise_data.size() != rows * cols ||
        rowwise_scales.size() != shapes[0] * shapes[1] || colwise_scales.size() != shapes[2] * shapes[3])
        throw std::invalid_argument(
            "muon::mxfp8_quantize_host: output spans do not match rows, cols and the scale shapes");
    check(muon_mxfp8_quantize_host(input, input_dtype, rows, cols, scale_layout, rowwise_data.data(),
                                   rowwise_scales.data(), colwise_data.data(), colwise_scales.data()));
}

/// The C view of a registered param (every field of muon_param_view_t is public) plus typed
/// spans of its storage (host memory on the host backend, device memory on cuda). T is the
/// buffer's element type: float for MUON_DTYPE_F32, a 2-byte type (uint16_t raw bits,
/// __nv_bfloat16, ...) for MUON_DTYPE_BF16; any other T throws std::invalid_argument, since a
/// span of the wrong width would reach past the buffer. The pointers stay valid until the
/// optimizer is destroyed.
struct ParamView : muon_param_view_t {
    ParamView() noexcept : muon_param_view_t{} { struct_size = sizeof(muon_param_view_t); }

    /// The param's model-dtype storage, `dtype` (empty for an MXFP8 param, whose data is NULL).
    template <class T>
    Span<T> data_span() const {
        check_element<T>(dtype, "data_span");
        return data ? Span<T>(static_cast<T *>(data), static_cast<std::size_t>(numel)) : Span<T>();
    }

    /// The gradient storage (config grad_dtype, `grad_dtype`) the framework accumulates into.
    template <class T>
    Span<T> grad_span() const {
        check_element<T>(grad_dtype, "grad_span");
        return grad ? Span<T>(static_cast<T *>(grad), static_cast<std::size_t>(numel)) : Span<T>();
    }

    /// MXFP8 E4M3 data, mxfp8_rows x mxfp8_cols bytes (empty unless MUON_PARAM_FLAG_MXFP8).
    Span<uint8_t> mxfp8_rowwise_data_span() const noexcept {
        return mxfp8_bytes(mxfp8_rowwise_data, mxfp8_rows * mxfp8_cols);
    }
    Span<uint8_t> mxfp8_colwise_data_span() const noexcept {
        return mxfp8_bytes(mxfp8_colwise_data, mxfp8_rows * mxfp8_cols);
    }
    /// MXFP8 E8M0 scales, sized by mxfp8_scale_shape() (empty unless MXFP8).
    Span<uint8_t> mxfp8_rowwise_scales_span() const {
        if (!mxfp8_rowwise_scales) return {};
        const auto s = mxfp8_scale_shape(mxfp8_rows, mxfp8_cols);
        return mxfp8_bytes(mxfp8_rowwise_scales, s[0] * s[1]);
    }
    Span<uint8_t> mxfp8_colwise_scales_span() const {
        if (!mxfp8_colwise_scales) return {};
        const auto s = mxfp8_scale_shape(mxfp8_rows, mxfp8_cols);
        return mxfp8_bytes(mxfp8_colwise_scales, s[2] * s[3]);
    }

private:
    template <class T>
    static void check_element(uint32_t dtype, const char *span) {
        const bool f32 = std::is_same<typename std::remove_cv<T>::type, float>::value;
        const bool ok = dtype == MUON_DTYPE_F32 ? f32 : dtype == MUON_DTYPE_BF16 && sizeof(T) == 2;
        if (!ok) {
            throw std::invalid_argument(std::string("muon::ParamView::") + span + ": T of " +
                                        std::to_string(sizeof(T)) + " bytes does not match the storage's " +
                                        (dtype == MUON_DTYPE_F32 ? "MUON_DTYPE_F32 (float)"
                                                                 : "MUON_DTYPE_BF16 (a 2-byte type)"));
        }
    }

    static Span<uint8_t> mxfp8_bytes(uint8_t *p, uint64_t n) noexcept {
        return p ? Span<uint8_t>(p, static_cast<std::size_t>(n)) : Span<uint8_t>();
    }
};

/// Owner of one muon_comm_t (move-only). Released with muon_comm_destroy.
class Comm {
public:
    Comm() noexcept = default;
    /// Takes ownership of @p comm (may be NULL).
    explicit Comm(muon_comm_t *comm) noexcept : handle_(comm) {}
    Comm(Comm &&other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Comm &operator=(Comm &&other) noexcept {
        if (this != &other) {
            reset();
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    Comm(const Comm &) = delete;
    Comm &operator=(const Comm &) = delete;
    ~Comm() { reset(); }

    /// An in-process group of @p world_size ranks for the host backend; element r is rank r.
    /// Each rank is then used by its own thread.
    static std::vector<Comm> host_group(uint32_t world_size) {
        std::vector<muon_comm_t *> raw(world_size, nullptr);
        check(muon_host_group_create(world_size, raw.data()));
        std::vector<Comm> comms;
        comms.reserve(world_size);
        for (muon_comm_t *c : raw) comms.emplace_back(c);
        return comms;
    }

    /// Wraps the caller's ncclComm_t (borrowed: it must outlive this handle and every
    /// optimizer made from it; muon never finalizes, destroys or aborts it).
    static Comm nccl(struct ncclComm *nccl_comm) {
        muon_comm_t *c = nullptr;
        check(muon_comm_create_nccl(nccl_comm, &c));
        return Comm(c);
    }

    uint32_t rank() const {
        uint32_t r = 0;
        check(muon_comm_rank(handle_, &r));
        return r;
    }
    uint32_t size() const {
        uint32_t n = 0;
        check(muon_comm_size(handle_, &n));
        return n;
    }

    muon_comm_t *get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }
    /// Gives up ownership; the caller then calls muon_comm_destroy.
    muon_comm_t *release() noexcept { return std::exchange(handle_, nullptr); }
    /// Destroys the handle now and throws on a teardown error. Idempotent.
    void close() { check(muon_comm_destroy(std::exchange(handle_, nullptr))); }

private:
    void reset() noexcept { (void)muon_comm_destroy(std::exchange(handle_, nullptr)); }
    muon_comm_t *handle_ = nullptr;
};

/// Owner of one muon_optimizer_t (move-only), one per rank. Methods map 1:1 to the
/// muon_optimizer_* functions and throw muon::Error on failure. One thread at a time.
class Optimizer {
public:
    Optimizer() noexcept = default;
    /// Takes ownership of @p opt (may be NULL).
    explicit Optimizer(muon_optimizer_t *opt) noexcept : handle_(opt) {}
    /// muon_optimizer_create: @p cfg is copied; @p comm must outlive the optimizer; @p stream
    /// is the caller's cudaStream_t (borrowed), NULL on the host backend.
    Optimizer(const muon_config_t &cfg, const Comm &comm, struct CUstream_st *stream = nullptr) {
        check(muon_optimizer_create(&cfg, comm.get(), stream, &handle_));
    }
    Optimizer(Optimizer &&other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Optimizer &operator=(Optimizer &&other) noexcept {
        if (this != &other) {
            reset();
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    Optimizer(const Optimizer &) = delete;
    Optimizer &operator=(const Optimizer &) = delete;
    ~Optimizer() { reset(); }

    /// Makes the gradient norm, clip and skip global over @p group (before finalize); flag
    /// copies another rank counts with MUON_PARAM_FLAG_NORM_REPLICA.
    void set_norm_group(const Comm &group) { check(muon_optimizer_set_norm_group(handle_, group.get())); }
    /// The tensor-parallel group MUON_TP_MODE_DUPLICATED gathers TP-sharded matrices over
    /// (before finalize).
    void set_tp_group(const Comm &group) { check(muon_optimizer_set_tp_group(handle_, group.get())); }
    /// Registers a param (forward order, before finalize); returns its id.
    uint32_t add_param(const muon_param_desc_t &desc) {
        uint32_t id = 0;
        check(muon_optimizer_add_param(handle_, &desc, &id));
        return id;
    }
    /// MUON_ROUTE_MUON or MUON_ROUTE_ADAMW.
    uint32_t param_route(uint32_t param_id) const {
        uint32_t route = 0;
        check(muon_optimizer_param_route(handle_, param_id, &route));
        return route;
    }
    /// After finalize: param_id's multipliers of its route's learning rate and weight decay
    /// for the later steps (muon_optimizer_set_param_scales).
    void set_param_scales(uint32_t param_id, float lr_scale, float wd_scale) {
        check(muon_optimizer_set_param_scales(handle_, param_id, lr_scale, wd_scale));
    }
    /// Collective: plans the layout and verifies every rank planned the same.
    void finalize() { check(muon_optimizer_finalize(handle_)); }
    /// The plan and its report as JSON.
    /// The buckets of the finalized plan: wait_params takes 0 .. num_buckets() - 1.
    uint32_t num_buckets() const {
        uint32_t count = 0;
        check(muon_optimizer_num_buckets(handle_, &count));
        return count;
    }

    std::string plan_json() const {
        std::size_t len = 0;
        muon_status_t s = muon_optimizer_plan_json(handle_, nullptr, 0, &len);
        if (s != MUON_STATUS_BUFFER_TOO_SMALL) check(s);
        std::string json(len, '\0');
        check(muon_optimizer_plan_json(handle_, json.data(), json.size(), &len));
        json.resize(len > 0 ? len - 1 : 0);  // drop the NUL
        return json;
    }
    /// Where param @p param_id lives (after finalize).
    ParamView param_view(uint32_t param_id) const {
        ParamView v;
        check(muon_optimizer_param_view(handle_, param_id, &v));
        return v;
    }

    void zero_grad() { check(muon_optimizer_zero_grad(handle_)); }
    /// Forward pre-hook: before the first use of a param of @p bucket.
    void wait_params(uint32_t bucket) { check(muon_optimizer_wait_params(handle_, bucket)); }
    /// Sharded params: issue the gather of @p bucket ahead of its use (prefetch).
    void gather_params(uint32_t bucket) { check(muon_optimizer_gather_params(handle_, bucket)); }
    /// Sharded params: end @p bucket's gathered window after its last use.
    void release_params(uint32_t bucket) { check(muon_optimizer_release_params(handle_, bucket)); }
    /// Backward hook: the param's gradient is complete for this iteration.
    void grad_ready(uint32_t param_id) { check(muon_optimizer_grad_ready(handle_, param_id)); }
    /// One step and what it did (waits for the caller's stream to read it back).
    muon_step_info_t step(const muon_step_args_t &args) {
        muon_step_info_t info{};
        info.struct_size = sizeof info;
        check(muon_optimizer_step(handle_, &args, &info));
        return info;
    }
    /// One step, only enqueued: never waits for the device (read it later with step_info()).
    void step_async(const muon_step_args_t &args) { check(muon_optimizer_step(handle_, &args, nullptr)); }
    /// Copies the arguments of the next steps to the device, ordered on the stream.
    void set_step_args(const muon_step_args_t &args) { check(muon_optimizer_set_step_args(handle_, &args)); }
    /// One step with the arguments last set by set_step_args: copies nothing from the host
    /// (the form to capture in a CUDA graph); never waits.
    void step_with_set_args() { check(muon_optimizer_step(handle_, nullptr, nullptr)); }
    /// QK-clip (Kimi K2's MuonClip) of @p clips by the next step: every rank, same params,
    /// before step; enqueues nothing (muon_optimizer_qk_clip).
    void qk_clip(const std::vector<muon_qk_clip_t> &clips, float threshold, float alpha = 0.5f) {
        check(muon_optimizer_qk_clip(handle_, clips.data(), clips.size(), threshold, alpha));
    }
    /// What the last step did; waits for the caller's stream.
    muon_step_info_t step_info() {
        muon_step_info_t info{};
        info.struct_size = sizeof info;
        check(muon_optimizer_step_info(handle_, &info));
        return info;
    }
    void synchronize() { check(muon_optimizer_synchronize(handle_)); }
    /// Orders the caller's stream after the library's queued communication (no host wait);
    /// the last call of an iteration captured in a CUDA graph (see muon_optimizer_join).
    void join() { check(muon_optimizer_join(handle_)); }

    /// Collective: every rank saves its optimizer state into checkpoint directory @p dir
    /// (same path on every rank; replaced atomically). Host-synchronizing.
    void save(const std::string &dir) { check(muon_optimizer_save(handle_, dir.c_str())); }
    /// Collective: every rank loads checkpoint @p dir (written at any dp size and layout) and
    /// re-synchronizes its params; on failure nothing changed on any rank. Between steps.
    void load(const std::string &dir) { check(muon_optimizer_load(handle_, dir.c_str())); }
    /// Collective: loads every registered param from the one of @p dirs that holds it (the
    /// expert checkpoints of another expert-parallel split); others are left out.
    void load_union(const std::vector<std::string> &dirs) {
        std::vector<const char *> paths;
        for (const std::string &d : dirs) paths.push_back(d.c_str());
        check(muon_optimizer_load_union(handle_, paths.data(), paths.size()));
    }

    muon_optimizer_t *get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }
    /// Gives up ownership; the caller then calls muon_optimizer_destroy.
    muon_optimizer_t *release() noexcept { return std::exchange(handle_, nullptr); }
    /// Destroys the handle now and throws on a teardown error. Idempotent.
    void close() { check(muon_optimizer_destroy(std::exchange(handle_, nullptr))); }

private:
    void reset() noexcept { (void)muon_optimizer_destroy(std::exchange(handle_, nullptr)); }
    muon_optimizer_t *handle_ = nullptr;
};

/// One step of several optimizers of this rank with one gradient norm, clip coefficient and skip
/// decision (muon_optimizers_step; e.g. a dense and an expert optimizer). @p args empty uses the
/// arguments each last set with set_step_args, else one per optimizer (struct_size is set
/// here). Every rank passes its optimizers in the same order. Enqueues only.
inline void step_shared(std::initializer_list<std::reference_wrapper<Optimizer>> optimizers,
                        std::initializer_list<muon_step_args_t> args = {}) {
    std::vector<muon_optimizer_t *> handles;
    for (Optimizer &opt : optimizers) handles.push_back(opt.get());
    std::vector<muon_step_args_t> array(args);
    for (muon_step_args_t &a : array) a.struct_size = sizeof a;
    check(muon_optimizers_step(handles.data(), handles.size(), array.empty() ? nullptr : array.data()));
}

/// The library's host Newton–Schulz orthogonalization of a rows×cols row-major matrix.
inline void newton_schulz_host(Span<const float> in, Span<float> out, uint32_t rows, uint32_t cols,
                               uint32_t coefficient_set = MUON_COEFFICIENTS_QUINTIC, uint32_t steps = 5,
                               uint32_t precision = MUON_NS_PRECISION_F32) {
    if (in.size() != std::size_t(rows) * cols || out.size() != in.size())
        throw std::invalid_argument("muon::newton_schulz_host: in and out must hold rows*cols floats");
    check(muon_newton_schulz_host(in.data(), out.data(), rows, cols, coefficient_set, steps, precision));
}

/// The library's host Newton–Schulz with every Newton–Schulz field of @p cfg (coefficients,
/// steps, precision, eps, method): what an optimizer with @p cfg computes for one matrix.
inline void newton_schulz_host(Span<const float> in, Span<float> out, uint32_t rows, uint32_t cols,
                               const muon_config_t &cfg) {
    if (in.size() != std::size_t(rows) * cols || out.size() != in.size())
        throw std::invalid_argument("muon::newton_schulz_host: in and out must hold rows*cols floats");
    check(muon_newton_schulz_host_config(in.data(), out.data(), rows, cols, &cfg));
}

}  // namespace muon

#endif  // MUON_OPT_HPP
