#!/usr/bin/env python3
"""Peer script: runs DeepSpeed's published Gram Newton–Schulz on generated inputs.

The functions `zeropower_via_gram_newtonschulz` and `zeropower_via_newtonschulz5` are read
from `deepspeed/runtime/zero/muon/original_muon.py` at DeepSpeed commit 8a77f381 ("Add Gram
Newton-Schulz orthogonalization for Muon optimizer (#7953)") in a DeepSpeed git checkout given
on the command line, and executed unchanged but for two things, both recorded in the README:
- their decorator `@compiler.compile()` (`torch.compile`) is dropped: they run eagerly;
- `get_accelerator()` answers `is_fp16_supported() == is_bf16_supported() == False`, which
  selects the published float32 branch (`compute_dtype = torch.float32`).
Nothing of DeepSpeed's file is stored in this repository.

Usage (from the repository root):
    PYTHONPATH=~/.cache/muon_py/torch-2.15.0 python3 \
        tests/data/golden/peer/gram_ns_deepspeed.py DEEPSPEED_GIT_DIR tests/data/golden

Writes `gram_ns/*.bin` under the output directory and prints the manifest's `gram_ns`
entries as JSON.
"""

import argparse
import ast
import json
import pathlib
import subprocess

import numpy as np
import torch

COMMIT = "8a77f381a4d8f3bf65747ac571b94324eaa4a29a"
SOURCE = "deepspeed/runtime/zero/muon/original_muon.py"
GRAM = "zeropower_via_gram_newtonschulz"
STANDARD = "zeropower_via_newtonschulz5"
STEPS = 5
SEED = 20261126
SHAPES = [(32, 128), (64, 224), (192, 48), (96, 352)]
SPECTRA = ["gaussian", "decaying", "ill_conditioned"]


class Float32Accelerator:
    """What `get_accelerator()` answers: neither half type, so the float32 branch runs."""

    def is_fp16_supported(self):
        return False

    def is_bf16_supported(self):
        return False


def published_functions(deepspeed_git_dir):
    source = subprocess.run(
        ["git", "-C", deepspeed_git_dir, "show", f"{COMMIT}:{SOURCE}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    tree = ast.parse(source)
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in (GRAM, STANDARD)]
    assert sorted(n.name for n in wanted) == sorted((GRAM, STANDARD)), "functions not found"
    for node in wanted:
        node.decorator_list = []
    namespace = {"torch": torch, "get_accelerator": Float32Accelerator}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), f"{COMMIT}:{SOURCE}", "exec"), namespace)
    return namespace[GRAM], namespace[STANDARD]


def orthonormal(rng, rows, cols):
    q, r = np.linalg.qr(rng.standard_normal((rows, cols)))
    return q * np.sign(np.diag(r))


def make_input(rng, rows, cols, spectrum):
    """float64 `rows × cols`: Gaussian entries, or U·diag(σ)·Vᵀ with random orthonormal U, V."""
    if spectrum == "gaussian":
        return rng.standard_normal((rows, cols))
    k = min(rows, cols)
    if spectrum == "decaying":
        sigma = 1.0 / np.arange(1, k + 1)
    else:
        sigma = np.geomspace(1.0, 1e-4, k)
    return (orthonormal(rng, rows, k) * sigma) @ orthonormal(rng, cols, k).T


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("deepspeed_git_dir")
    parser.add_argument("out_dir")
    args = parser.parse_args()
    torch.set_num_threads(1)
    gram_ns, standard_ns = published_functions(args.deepspeed_git_dir)
    out = pathlib.Path(args.out_dir)
    (out / "gram_ns").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    entries = []
    for rows, cols in SHAPES:
        for spectrum in SPECTRA:
            x = make_input(rng, rows, cols, spectrum).astype("<f4")
            g = torch.from_numpy(x.copy())
            with torch.no_grad():
                gram = gram_ns(g, STEPS)
                standard = standard_ns(g, STEPS)
            assert gram.dtype == standard.dtype == torch.float32
            gram, standard = gram.numpy().astype("<f4"), standard.numpy().astype("<f4")
            stem = f"gram_ns/{rows}x{cols}_{spectrum}"
            files = {
                "input_f32": f"{stem}_in.f32.bin",
                "gram_out_f32": f"{stem}_gram_out.f32.bin",
                "standard_out_f32": f"{stem}_standard_out.f32.bin",
            }
            for key, array in (("input_f32", x), ("gram_out_f32", gram), ("standard_out_f32", standard)):
                (out / files[key]).write_bytes(np.ascontiguousarray(array).tobytes())
            entries.append(
                {
                    "rows": rows,
                    "cols": cols,
                    "spectrum": spectrum,
                    "coefficients": "simple",
                    "steps": STEPS,
                    "restart_at": 2,
                    "normalization": "X / (||X||_F + 1e-7)",
                    **files,
                    "gram_vs_standard_max_abs_diff": float(np.abs(gram - standard).max()),
                }
            )
    print(json.dumps(entries, indent=1))


if __name__ == "__main__":
    main()
