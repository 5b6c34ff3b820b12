#!/usr/bin/env bash
# The wheel of scripts/build-wheel.sh installs into a clean venv and passes the PyTorch
# adapter's tests there with no Rust toolchain on the PATH and no MUON_OPT_LIB: the library
# they load is the wheel's copy. MUON_PYTHON_EXTRAS: a directory holding numpy and torch.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash scripts/build-wheel.sh "$work/wheels" >/dev/null
wheel=$(ls "$work"/wheels/muon_opt-*-py3-none-linux_*.whl)
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --no-deps "$wheel"
mkdir "$work/run"
cp bindings/python/tests/test_torch*.py "$work/run/"
cd "$work/run"
env -i HOME="$HOME" PATH="$work/venv/bin:/usr/bin:/bin" PYTHONPATH="${MUON_PYTHON_EXTRAS:-}" \
    MUON_REQUIRE_TORCH=1 bash -c '
        set -euo pipefail
        if command -v cargo || command -v rustc; then echo "a Rust toolchain is on the PATH"; exit 1; fi
        python - <<PY
import muon_opt, pathlib, sys
path = pathlib.Path(muon_opt.lib().path).resolve()
assert path.is_relative_to(pathlib.Path(sys.prefix).resolve()), path
assert (pathlib.Path(muon_opt.__file__).parent / "include" / "muon_opt.h").is_file()
print("wheel: library", path)
PY
        python -m unittest discover -s . -p "test_torch*.py"'
