#!/usr/bin/env bash
# Builds a platform wheel of the Python package that carries libmuon_opt.so and muon_opt.h, so
# `pip install` of it needs no Rust toolchain: bash scripts/build-wheel.sh [OUT_DIR] (default
# target/wheels). Builds the release library first if it is missing; pip fetches setuptools.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/wheels}"
[ -f target/release/libmuon_opt.so ] || cargo build --release --locked
mkdir -p "$out"
rm -rf bindings/python/build
MUON_OPT_WHEEL_LIB="$PWD/target/release/libmuon_opt.so" \
    python3 -m pip wheel --quiet --no-deps --wheel-dir "$out" bindings/python
rm -rf bindings/python/build bindings/python/*.egg-info
ls "$out"/muon_opt-*.whl
