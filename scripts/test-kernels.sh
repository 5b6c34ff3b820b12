#!/usr/bin/env bash
# Runs every test that executes the kernels of kernels/*.cu on the CPU (tests/cuda_emulated.rs:
# the cuda backend's translation on an emulated device whose launches run the real kernels,
# compared with the host backend bit for bit) three ways: plain; under AddressSanitizer and
# UndefinedBehaviorSanitizer; under ThreadSanitizer. Exits non-zero on any failure or report.
# docs/kernels-cpu.md says what this proves and what only a GPU shows.
#
#   bash scripts/test-kernels.sh                 # all three
#   bash scripts/test-kernels.sh --sanitizers    # the two sanitizer runs (scripts/test.sh, whose
#                                                # cargo test ran the plain one)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v g++ >/dev/null || { echo "test-kernels: g++ is required"; exit 1; }
export MUON_REQUIRE_CXX=1
step() { printf '\n== %s\n' "$*"; }
cargo test --release --locked --test cuda_emulated --no-run

if [ "${1:-}" != --sanitizers ]; then
    step "kernels on the CPU: plain"
    cargo test --release --locked --test cuda_emulated
fi

# The kernels' library is built with the sanitizer and loaded into the (uninstrumented) test
# process, so the sanitizer's runtime is preloaded. Rust's own allocations are not checked,
# hence no leak detection; any report fails the run.
step "kernels on the CPU: AddressSanitizer + UndefinedBehaviorSanitizer"
MUON_KERNELS_SANITIZE=address ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    LD_PRELOAD="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libubsan.so)" \
    cargo test --release --locked --test cuda_emulated

step "kernels on the CPU: ThreadSanitizer (the threads of a block race without their barriers)"
MUON_KERNELS_SANITIZE=thread \
    TSAN_OPTIONS="halt_on_error=1:report_signal_unsafe=0:suppressions=$PWD/tests/kernels_cpu/tsan.supp" \
    LD_PRELOAD="$(g++ -print-file-name=libtsan.so)" \
    cargo test --release --locked --test cuda_emulated -- --test-threads=1 --skip tensor_parallel_shards --skip ranks_
# (The multi-rank tests — tensor-parallel and ranks_* — outlast any time limit under
# ThreadSanitizer, their ranks' launches serialized through one kernel lock; every kernel they
# launch runs under it in the one-rank tests, which launch them all.)
