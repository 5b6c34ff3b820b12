#!/usr/bin/env bash
# Builds the device bundle: everything the on-device check needs, built here (the GPU machine
# has no Rust toolchain and no network), in one ignored folder of at most 48 MiB.
#
#   bash scripts/device/bundle.sh [DIR]        # default DIR: target/device-bundle
#
# DIR/lib/libmuon_opt.so, DIR/bin/muon-opt, DIR/tests/{cuda_gpu,kernels_nvrtc,cuda_no_gpu}
# (release, --features gpu-tests, stripped), DIR/kernels/*.cu, DIR/check.sh (the runner) and
# DIR/manifest_dir (the checkout path compiled into the test executables, which read
# tests/data and kernels/ from it). Needs no GPU. Prints the bundle's size and fails above the
# limit. On the device: `bash DIR/check.sh` (docs/device-run.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-target/device-bundle}"
limit_mib=48
tests=(cuda_gpu kernels_nvrtc cuda_no_gpu)

test_args=()
for t in "${tests[@]}"; do test_args+=(--test "$t"); done
cargo build --release --locked --features gpu-tests --lib --bin muon-opt
# The test executables' paths, from cargo's JSON messages (one compiler-artifact line each).
mapfile -t executables < <(
    cargo test --release --locked --features gpu-tests --no-run --message-format=json "${test_args[@]}" \
        | python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["kind"] == ["test"]:
        print(msg["target"]["name"], msg["executable"])
')
[ "${#executables[@]}" -eq "${#tests[@]}" ] \
    || { echo "bundle: expected ${#tests[@]} test executables, cargo reported ${#executables[@]}" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/lib" "$out/bin" "$out/tests" "$out/kernels"
strip -o "$out/lib/libmuon_opt.so" target/release/libmuon_opt.so
strip -o "$out/bin/muon-opt" target/release/muon-opt
for entry in "${executables[@]}"; do
    strip -o "$out/tests/${entry%% *}" "${entry#* }"
done
cp kernels/*.cu kernels/*.cuh "$out/kernels/"
cp scripts/device/check.sh "$out/check.sh"
pwd >"$out/manifest_dir"
{ git rev-parse HEAD && [ -z "$(git status --porcelain)" ] || echo dirty; } 2>/dev/null | paste -sd- >"$out/commit"

size_kib=$(du -sk "$out" | cut -f1)
printf 'device bundle %s: %d.%d MiB (limit %d MiB), commit %s\n' "$out" $((size_kib / 1024)) $((size_kib % 1024 * 10 / 1024)) \
    "$limit_mib" "$(cat "$out/commit")"
[ "$size_kib" -le $((limit_mib * 1024)) ] || { echo "bundle: over the $limit_mib MiB limit" >&2; exit 1; }
