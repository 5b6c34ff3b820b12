#!/usr/bin/env bash
# Runs every test of the project: Rust unit and integration tests, the header check, clippy,
# rustfmt, the export check, the NVRTC kernel compile test, the C/C++ googletest harness, the
# C++ example trainer and the Python binding's tests.
set -euo pipefail
cd "$(dirname "$0")/.."

nvrtc_dir="${MUON_NVRTC_DIR:-$HOME/.cache/muon_nvrtc/13.0/nvidia/cu13}"
if [ -d "$nvrtc_dir/lib" ]; then
    export LD_LIBRARY_PATH="$nvrtc_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export MUON_CUDA_INCLUDE_DIR="${MUON_CUDA_INCLUDE_DIR:-$nvrtc_dir/include}"
fi

step() { printf '\n== %s\n' "$*"; }

step "panic = \"unwind\" in every profile (test and bench inherit dev and release)"
for profile in dev release; do
    awk -v p="[profile.$profile]" '$0==p{f=1;next} /^\[/{f=0} f&&/^panic *= *"unwind"/{ok=1} END{exit !ok}' Cargo.toml \
        || { echo "Cargo.toml: [profile.$profile] must set panic = \"unwind\""; exit 1; }
done

step "every source file is under 900 lines (the generated header excepted)"
long=$(git ls-files '*.rs' '*.cu' '*.cuh' '*.py' '*.cpp' '*.hpp' '*.c' '*.sh' | xargs wc -l | awk '$2 != "total" && $1 >= 900')
[ -z "$long" ] || { echo "split these files:"; echo "$long"; exit 1; }

step "build (release) and header freshness"
cargo build --release --locked
git diff --exit-code -- include/muon_opt.h \
    || { echo "include/muon_opt.h changed when regenerated: commit the regenerated header"; exit 1; }

step "docs/performance.md is what 'muon-opt simulate --scenario all --markdown' prints"
target/release/muon-opt simulate --scenario all --markdown | diff -u docs/performance.md - \
    || { echo "docs/performance.md is stale: regenerate it with the command above"; exit 1; }

step "docs/validation.md is what 'muon-opt simulate --validation' prints"
target/release/muon-opt simulate --validation | diff -u docs/validation.md - \
    || { echo "docs/validation.md is stale: regenerate it with the command above"; exit 1; }

step "exported symbols are muon_* only"
bad=$(nm -D --defined-only target/release/libmuon_opt.so | awk '$2 ~ /^[TtWwDdBbRr]$/ {print $3}' | grep -v '^muon_' || true)
[ -z "$bad" ] || { echo "unexpected exports:"; echo "$bad"; exit 1; }

step "cargo test"
cargo test --release --locked

# MUON_NVRTC12_DIR: an NVRTC 12.4 install (.ci/run makes one); only its libnvrtc on the path, so
# the loader falls back from libnvrtc.so.13 to .12 as on a CUDA 12 machine.
nvrtc12_dir="${MUON_NVRTC12_DIR:-$HOME/.cache/muon_nvrtc/12.4/nvidia}"
if [ -f "$nvrtc12_dir/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
    step "kernels compile with NVRTC 12.4 (CUDA 12 drivers)"
    LD_LIBRARY_PATH="$nvrtc12_dir/cuda_nvrtc/lib" MUON_CUDA_INCLUDE_DIR="$nvrtc12_dir/cuda_runtime/include" \
        MUON_NVRTC_MAJOR=12 MUON_REQUIRE_NVRTC=1 cargo test --release --locked --test kernels_nvrtc
elif [ -n "${MUON_NVRTC12_DIR:-}" ]; then
    echo "MUON_NVRTC12_DIR=$MUON_NVRTC12_DIR holds no libnvrtc.so.12"; exit 1
fi

step "clippy and rustfmt"
cargo clippy --release --locked --all-targets -- -D warnings
cargo clippy --release --locked --all-targets --features gpu-tests -- -D warnings
cargo fmt --check
RUSTDOCFLAGS="-D warnings" cargo doc --release --locked --no-deps

step "device bundle (scripts/device/bundle.sh): builds within 48 MiB; its runner skips without a GPU"
bash scripts/device/bundle.sh
device_out=$(mktemp -d)
OUT="$device_out" bash target/device-bundle/check.sh | tee "$device_out/stdout"
grep -q '^no GPU: skipped (' "$device_out/stdout" || { echo "check.sh did not report the skip"; exit 1; }
{ target/release/muon-opt simulate --device-run "$device_out/device-run.json" 2>&1 || true; } | grep -q "status 'skipped'" \
    || { echo "check.sh wrote no skipped device run"; exit 1; }
# Its GPU path on a stand-in nvidia-smi (the test executables then skip): the JSON it assembles
# from the environment and the tests' output follows the schema muon-opt reads.
mkdir -p "$device_out/bin" "$device_out/gpu"
printf '#!/bin/sh\ncase "$*" in -L) echo "GPU 0: stand-in";; *query*) echo "stand-in, 1 MiB, 0";; esac\n' >"$device_out/bin/nvidia-smi"
chmod +x "$device_out/bin/nvidia-smi"
PATH="$device_out/bin:$PATH" OUT="$device_out/gpu" bash target/device-bundle/check.sh >/dev/null
python3 - "$device_out/gpu/device-run.json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
suites = {t["suite"] for t in run["tests"]}
assert suites == {"cuda_gpu", "kernels_nvrtc", "cuda_no_gpu"}, suites
assert all(t["status"] == "skip" for t in run["tests"] if t["suite"] == "cuda_gpu"), run["tests"]
assert run["environment"]["gpu"] == "stand-in, 1 MiB, 0", run["environment"]
print(f"stand-in GPU path: {len(run['tests'])} tests recorded, status {run['status']}")
PY
{ target/release/muon-opt simulate --device-run "$device_out/gpu/device-run.json" 2>&1 || true; } | grep -q "nothing was measured" \
    || { echo "the stand-in run's JSON does not parse as a device run"; exit 1; }
rm -rf "$device_out"

step "install under a prefix (scripts/install.sh): versioned library, headers, pkg-config, CMake package"
prefix="$PWD/target/install"
rm -rf "$prefix"
bash scripts/install.sh "$prefix"
# pkg-config: a C program built with only its flags links and runs against the prefix.
consumer=$(mktemp -d)
trap 'rm -rf "$consumer"' EXIT
cat >"$consumer/version.c" <<'C'
#include <muon_opt.h>
#include <stdio.h>
int main(void) {
    unsigned v = muon_get_version();
    if (v != MUON_VERSION_CODE) { fprintf(stderr, "library %u != header %d\n", v, MUON_VERSION_CODE); return 1; }
    printf("pkg-config consumer: libmuon_opt %u\n", v);
    return 0;
}
C
# From a copy of the prefix elsewhere: the .pc names the copy's paths, not the original's.
cp -a "$prefix" "$consumer/moved"
moved_flags=$(PKG_CONFIG_PATH="$consumer/moved/lib/pkgconfig" pkg-config --cflags --libs muon_opt)
case "$moved_flags" in
    *"$prefix"*) echo "the moved muon_opt.pc still names $prefix: $moved_flags" >&2; exit 1 ;;
    *"$consumer/moved/"*) ;;
    *) echo "the moved muon_opt.pc does not name the copy: $moved_flags" >&2; exit 1 ;;
esac
# shellcheck disable=SC2086
cc -std=c99 -Wall -Werror "$consumer/version.c" -o "$consumer/version" $moved_flags
LD_LIBRARY_PATH="$consumer/moved/lib" "$consumer/version"
# In the build tree: linked with -L target/release -lmuon_opt, loaded through the soname link.
cc -std=c99 -Wall -Werror -Iinclude "$consumer/version.c" -o "$consumer/in_tree" -Ltarget/release -lmuon_opt
LD_LIBRARY_PATH=target/release "$consumer/in_tree"

step "C/C++ harness (googletest via ctest, the installed library through find_package)"
cmake -S cpp_tests -B cpp_tests/build -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build cpp_tests/build -j 2
ctest --test-dir cpp_tests/build --output-on-failure

step "C++ example trainer, built outside the repository from the installed prefix only"
cp -r examples/cpp_trainer "$consumer/cpp_trainer"
rm -rf "$consumer/cpp_trainer/build"
cmake -S "$consumer/cpp_trainer" -B "$consumer/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$consumer/build" -j 2
"$consumer/build/cpp_trainer"   # non-zero unless the loss falls and the ranks agree bitwise
# Lazy comm stream: a forward pre-hook (wait_params) missing from the guide would show as stale params.
MUON_HOST_COMM_MODE=lazy "$consumer/build/cpp_trainer" >/dev/null

step "Model-parallel example (examples/model_parallel: TP=2 x PP=2 x DP=2, EP=2 experts in a second optimizer, one clip and skip on every rank)"
cmake -S examples/model_parallel -B "$consumer/build-mp" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$consumer/build-mp" -j 2
LD_LIBRARY_PATH="$prefix/lib" "$consumer/build-mp/model_parallel"

step "Python binding (mirror vs header and C compiler, 2 ranks on threads, argument checks, numpy, torch)"
# MUON_PYTHON_EXTRAS: a directory holding numpy and torch (.ci/run installs one); without
# them those tests skip unless MUON_REQUIRE_NUMPY / MUON_REQUIRE_TORCH are set.
MUON_OPT_LIB="$PWD/target/release/libmuon_opt.so" PYTHONPATH="${MUON_PYTHON_EXTRAS:-}" \
    python3 -m unittest discover -s bindings/python/tests

step "the adapter's defaults train the demo LM like torch.optim.Muon (bindings/python/README.md)"
MUON_OPT_LIB="$PWD/target/release/libmuon_opt.so" PYTHONPATH="${MUON_PYTHON_EXTRAS:-}" \
    python3 bindings/python/examples/compare_lm.py --check >/dev/null

step "wheel (scripts/build-wheel.sh) carries the library: installs into a clean venv, adapter tests pass without Rust"
bash scripts/test-wheel.sh

step "pip install bindings/python; the package finds the library through the install prefix"
python3 -m pip install --quiet --no-deps --target "$consumer/site" bindings/python
rm -rf bindings/python/build bindings/python/*.egg-info
found=$(cd "$consumer" && env -u MUON_OPT_LIB MUON_OPT_PREFIX="$prefix" PYTHONPATH="$consumer/site" \
    python3 -c "import muon_opt; assert muon_opt.version() == muon_opt.MUON_VERSION_CODE; print(muon_opt.lib().path)")
[ "$found" = "$prefix/lib/libmuon_opt.so.0.1" ] || { echo "the installed package loaded '$found'" >&2; exit 1; }
echo "pip-installed muon_opt loaded $found"

step "the kernels on the CPU under the sanitizers (scripts/test-kernels.sh; cargo test ran them plain)"
bash scripts/test-kernels.sh --sanitizers
