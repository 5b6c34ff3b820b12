// Every kernel of kernels/*.cu, unchanged, compiled for the CPU through cuda_cpu.h, behind one
// entry point shaped like cuLaunchKernel: muon_cpu_launch(name, grid, block, args), args[i]
// pointing at parameter i's bytes. tests/cuda_emulated/kernels_cpu.rs builds it (plain, or
// with -fsanitize=address,undefined or thread) and the emulated device calls it for every
// launch of the translator.
#include "cuda_cpu.h"

#include "adamw.cu"
#include "cast.cu"
#include "muon.cu"
#include "mxfp8_quantize.cu"
#include "qk_clip.cu"
#include "reduce.cu"
#include "step.cu"

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// Workers that run the threads of one block at a time: worker t runs CUDA thread t.
class Pool {
public:
    ~Pool() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        start_.notify_all();
        for (auto &w : workers_) w.join();
    }

    // Runs `body` on `threads` workers (thread t with threadIdx of linear index t) and waits.
    void run_block(unsigned threads, const std::function<void(unsigned)> &body) {
        while (workers_.size() < threads) {
            const unsigned id = static_cast<unsigned>(workers_.size());
            workers_.emplace_back([this, id, seen = generation_] { work(id, seen); });
        }
        std::unique_lock<std::mutex> lock(mutex_);
        body_ = &body;
        threads_ = threads;
        remaining_ = threads;
        ++generation_;
        start_.notify_all();
        done_.wait(lock, [this] { return remaining_ == 0; });
        body_ = nullptr;
    }

private:
    // Worker `id`, created after generation `seen`, runs every later block that has a thread `id`.
    void work(unsigned id, unsigned seen) {
        for (;;) {
            const std::function<void(unsigned)> *body;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                start_.wait(lock, [&] { return stop_ || (generation_ != seen && id < threads_); });
                if (stop_) return;
                seen = generation_;
                body = body_;
            }
            (*body)(id);
            std::lock_guard<std::mutex> lock(mutex_);
            if (--remaining_ == 0) done_.notify_one();
        }
    }

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable start_, done_;
    const std::function<void(unsigned)> *body_ = nullptr;
    unsigned threads_ = 0, remaining_ = 0, generation_ = 0;
    bool stop_ = false;
};

Pool &pool() {
    static Pool p;
    return p;
}

// Parameter i of a launch, as its kernel declares it.
template <class T>
T arg(void **args, int i) {
    T v;
    std::memcpy(&v, args[i], sizeof v);
    return v;
}

// Runs `kernel` (a callable taking the parameters) over the grid, block after block: the
// threads of a block on the pool's workers when the kernel meets at barriers, else one after
// another on this thread (no barrier to meet: cuda_cpu.h's __syncthreads fails the launch).
void run(const unsigned grid[3], const unsigned block[3], bool barriers, const std::function<void()> &kernel) {
    muon_cpu::grid_dim = {grid[0], grid[1], grid[2]};
    muon_cpu::block_dim = {block[0], block[1], block[2]};
    const unsigned threads = block[0] * block[1] * block[2];
    const auto as_thread = [&](unsigned x, unsigned y, unsigned z, unsigned t) {
        muon_cpu::block_idx = {x, y, z};
        muon_cpu::thread_idx = {t % block[0], t / block[0] % block[1], t / (block[0] * block[1])};
        kernel();
    };
    for (unsigned z = 0; z < grid[2]; ++z) {
        for (unsigned y = 0; y < grid[1]; ++y) {
            for (unsigned x = 0; x < grid[0]; ++x) {
                if (!barriers) {
                    muon_cpu::block_barrier = nullptr;
                    for (unsigned t = 0; t < threads; ++t) as_thread(x, y, z, t);
                    continue;
                }
                std::barrier<> barrier(threads);
                muon_cpu::block_barrier = &barrier;
                pool().run_block(threads, [&](unsigned t) { as_thread(x, y, z, t); });
            }
        }
    }
}

}  // namespace

// 0 when `name` is a kernel of kernels/*.cu (and it ran), 1 when it is unknown. Launches from
// several threads (the ranks of a multi-rank test, parallel tests) run one at a time, as on
// one device of a process.
extern "C" int muon_cpu_launch(const char *name, const unsigned grid[3], const unsigned block[3], void **a) {
    static std::mutex launches;
    const std::lock_guard<std::mutex> one_at_a_time(launches);
    const std::string k(name);
    std::function<void()> kernel;
    // The kernels that meet at __syncthreads (their blocks' threads run concurrently).
    const bool barriers = k == "muon_ns_normalize" || k == "muon_ns_symmetrize" || k == "muon_apply" ||
                          k == "muon_normuon_moments" ||
                          k == "muon_mxfp8_quantize_bf16" || k == "muon_sumsq_partials" || k == "muon_sumsq_finish" ||
                          k == "muon_norm_partials" || k == "muon_step_scalars";
    if (k == "muon_adamw") {
        kernel = [&] {
            muon_adamw(arg<float *>(a, 0), arg<float *>(a, 1), arg<float *>(a, 2), arg<const void *>(a, 3),
                       arg<int>(a, 4), arg<muon_u64>(a, 5), arg<float>(a, 6), arg<float>(a, 7),
                       arg<const double *>(a, 8), arg<int>(a, 9), arg<int>(a, 10));
        };
    } else if (k == "muon_cast_f32_to_bf16") {
        kernel = [&] { muon_cast_f32_to_bf16(arg<const float *>(a, 0), arg<muon_u16 *>(a, 1), arg<muon_u64>(a, 2)); };
    } else if (k == "muon_cast") {
        kernel = [&] {
            muon_cast(arg<const void *>(a, 0), arg<int>(a, 1), arg<void *>(a, 2), arg<int>(a, 3), arg<muon_u64>(a, 4));
        };
    } else if (k == "muon_momentum") {
        kernel = [&] {
            muon_momentum(arg<const void *>(a, 0), arg<int>(a, 1), arg<void *>(a, 2), arg<float *>(a, 3),
                          arg<muon_u64>(a, 4), arg<const double *>(a, 5), arg<int>(a, 6), arg<int>(a, 7));
        };
    } else if (k == "muon_ns_normalize") {
        kernel = [&] {
            muon_ns_normalize(arg<const float *>(a, 0), arg<float *>(a, 1), arg<const double *>(a, 2),
                              arg<muon_u32>(a, 3), arg<muon_u32>(a, 4), arg<muon_u32>(a, 5), arg<int>(a, 6),
                              arg<float>(a, 7));
        };
    } else if (k == "muon_ns_symmetrize") {
        kernel = [&] {
            muon_ns_symmetrize(arg<const float *>(a, 0), arg<void *>(a, 1), arg<int>(a, 2), arg<muon_u32>(a, 3),
                               arg<muon_u32>(a, 4));
        };
    } else if (k == "muon_gemm_tile_tables") {
        kernel = [&] { muon_gemm_tile_tables(arg<muon_tile_lists>(a, 0)); };
    } else if (k == "muon_ns_add_identity") {
        kernel = [&] {
            muon_ns_add_identity(arg<const float *>(a, 0), arg<float *>(a, 1), arg<float>(a, 2), arg<muon_u32>(a, 3),
                                 arg<muon_u32>(a, 4));
        };
    } else if (k == "muon_apply") {
        kernel = [&] {
            muon_apply(arg<float *>(a, 0), arg<const float *>(a, 1), arg<muon_u32>(a, 2), arg<muon_u32>(a, 3),
                       arg<muon_u32>(a, 4), arg<int>(a, 5), arg<muon_u32>(a, 6), arg<const double *>(a, 7),
                       arg<float>(a, 8), arg<float>(a, 9), arg<float>(a, 10), arg<float *>(a, 11),
                       arg<int>(a, 12), arg<const double *>(a, 13), arg<float>(a, 14), arg<float>(a, 15),
                       arg<int>(a, 16));
        };
    } else if (k == "muon_normuon_line_sums") {
        kernel = [&] {
            muon_normuon_line_sums(arg<const float *>(a, 0), arg<double *>(a, 1), arg<muon_u32>(a, 2),
                                   arg<muon_u32>(a, 3), arg<muon_u32>(a, 4), arg<muon_u64>(a, 5),
                                   arg<muon_u64>(a, 6), arg<muon_u64>(a, 7), arg<const double *>(a, 8));
        };
    } else if (k == "muon_normuon_moments") {
        kernel = [&] {
            muon_normuon_moments(arg<const double *>(a, 0), arg<float *>(a, 1), arg<double *>(a, 2),
                                 arg<muon_u32>(a, 3), arg<muon_u32>(a, 4), arg<muon_u32>(a, 5), arg<float>(a, 6),
                                 arg<float>(a, 7), arg<const double *>(a, 8));
        };
    } else if (k == "muon_mxfp8_quantize_bf16") {
        kernel = [&] {
            muon_mxfp8_quantize_bf16(arg<const unsigned short *>(a, 0), arg<unsigned>(a, 1), arg<unsigned>(a, 2),
                                     arg<unsigned char *>(a, 3), arg<unsigned char *>(a, 4),
                                     arg<unsigned char *>(a, 5), arg<unsigned char *>(a, 6), arg<int>(a, 7));
        };
    } else if (k == "muon_qk_clip") {
        kernel = [&] {
            muon_qk_clip(arg<float *>(a, 0), arg<const float *>(a, 1), arg<muon_u64>(a, 2), arg<muon_u32>(a, 3),
                         arg<muon_u32>(a, 4), arg<muon_u32>(a, 5), arg<muon_qk_segments>(a, 6), arg<float>(a, 7),
                         arg<float>(a, 8));
        };
    } else if (k == "muon_sumsq_partials") {
        kernel = [&] { muon_sumsq_partials(arg<muon_sumsq_spans>(a, 0), arg<double *>(a, 1)); };
    } else if (k == "muon_sumsq_finish") {
        kernel = [&] {
            muon_sumsq_finish(arg<muon_sumsq_groups>(a, 0), arg<const double *>(a, 1), arg<double *>(a, 2));
        };
    } else if (k == "muon_norm_partials") {
        kernel = [&] { muon_norm_partials(arg<muon_sumsq_spans>(a, 0), arg<float>(a, 1), arg<muon_u64 *>(a, 2)); };
    } else if (k == "muon_step_scalars") {
        kernel = [&] {
            muon_step_scalars(arg<double *>(a, 0), arg<muon_norm_terms>(a, 1), arg<muon_u32>(a, 2), arg<float>(a, 3));
        };
    } else {
        return 1;
    }
    run(grid, block, barriers, kernel);
    return 0;
}
