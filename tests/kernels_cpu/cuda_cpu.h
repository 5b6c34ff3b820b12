// The CUDA the kernels of kernels/*.cu use, for the host C++ compiler: each block of a launch
// runs its CUDA threads as real OS threads (a pool, one worker per thread of the block) that
// meet at __syncthreads() on a real barrier, so a missing barrier is a real race (ThreadSanitizer
// reports it) and a wrong index a real out-of-bounds access (AddressSanitizer reports it).
// __shared__ variables are one instance per block: blocks run one after another, so a static
// variable is that instance. Arithmetic is IEEE f32/f64 with no contraction into FMAs (built
// with -ffp-contract=off), as NVRTC compiles the kernels (--fmad=false, IEEE division and
// square root).
#ifndef MUON_CUDA_CPU_H
#define MUON_CUDA_CPU_H

#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

namespace muon_cpu {
// The thread's coordinates (set by the launcher before it runs the kernel on this thread), the
// launch's shape and the barrier of the block being run.
inline thread_local dim3 thread_idx, block_idx;
inline dim3 block_dim, grid_dim;
inline std::barrier<> *block_barrier = nullptr;
}  // namespace muon_cpu

#define threadIdx (muon_cpu::thread_idx)
#define blockIdx (muon_cpu::block_idx)
#define blockDim (muon_cpu::block_dim)
#define gridDim (muon_cpu::grid_dim)

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(n)
#define __shared__ static

inline void __syncthreads() {
    if (!muon_cpu::block_barrier) {
        std::fprintf(stderr, "__syncthreads in a kernel launch.cpp runs without barriers: list it there\n");
        std::abort();
    }
    muon_cpu::block_barrier->arrive_and_wait();
}

inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
}
inline long long __double_as_longlong(double d) {
    long long l;
    std::memcpy(&l, &d, sizeof l);
    return l;
}
inline double __longlong_as_double(long long l) {
    double d;
    std::memcpy(&d, &l, sizeof d);
    return d;
}
inline float __double2float_rn(double d) { return static_cast<float>(d); }
// Leading zero bits of a 64-bit value (64 for 0).
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
// The device's atomic add: the blocks of a launch run one after another here, but a kernel
// still gets a real read-modify-write (ThreadSanitizer sees it as atomic).
inline unsigned long long atomicAdd(unsigned long long *address, unsigned long long value) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

using std::isfinite;
using std::sqrt;

#endif
