#!/usr/bin/env python3
"""Peer script: runs Emerging-Optimizers' published NorMuon or AdaMuon on generated inputs.

`emerging_optimizers.orthogonalized_optimizers.adaptive_muon.AdaptiveMuon` with
`moment2_method="normuon"` or `"adamuon"` (`--method`) from the PyPI package `emerging-optimizers==0.3.0` (the files of its
git tag v0.3.0, commit b309e2f01cda75dc96a6dc1a2355a7b3b64b5e16, which Megatron-LM pins),
installed unchanged with
    pip install --no-deps --ignore-requires-python --target DIR emerging-optimizers==0.3.0 absl-py
and imported from DIR. The package declares Python >= 3.12 for one thing this script runs on
3.11: `typing.override` (a decorator that returns its argument, new in 3.12), which is set to
that identity before the import. `fp32_matmul_prec="highest"` keeps every product in float32
(the library's `muon_ns_precision = f32`); the rest are the class defaults (quintic
coefficients, 5 steps, spectral scale, beta2 0.95, eps 1e-8, decoupled weight decay). Nothing
of the package is stored in this repository.

Usage (from the repository root):
    PYTHONPATH=DIR:~/.cache/muon_py/torch-2.15.0 python3 \
        tests/data/golden/peer/adaptive_muon_emerging_optimizers.py --method METHOD tests/data/golden

Writes `METHOD/*.bin` under the output directory and prints the manifest's `METHOD` entries
as JSON. Both methods draw the same inputs (the same seed and cases).
"""

import argparse
import json
import pathlib
import typing

typing.override = lambda f: f  # Python 3.12's typing.override, an identity decorator

import numpy as np  # noqa: E402
import torch  # noqa: E402
from emerging_optimizers import __version__ as EO_VERSION  # noqa: E402
from emerging_optimizers.orthogonalized_optimizers.adaptive_muon import AdaptiveMuon  # noqa: E402

SEED = 20261201
STEPS = 3
LR = 0.02
WEIGHT_DECAY = 0.1
MOMENTUM = 0.95
# (rows, cols, nesterov): tall (per-row statistics), wide (per-column), square.
CASES = [(96, 40, False), (40, 112, True), (64, 64, False)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=["normuon", "adamuon"], required=True)
    parser.add_argument("out_dir")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = pathlib.Path(args.out_dir)
    (out / args.method).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    entries = []
    for rows, cols, nesterov in CASES:
        init = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype("<f4")
        grads = rng.standard_normal((STEPS, rows, cols)).astype("<f4")
        param = torch.nn.Parameter(torch.from_numpy(init.copy()))
        opt = AdaptiveMuon(
            [param],
            lr=LR,
            momentum=MOMENTUM,
            weight_decay=WEIGHT_DECAY,
            nesterov=nesterov,
            fp32_matmul_prec="highest",
            moment2_method=args.method,
        )
        params, moments = [], []
        for step in range(STEPS):
            param.grad = torch.from_numpy(grads[step].copy())
            opt.step()
            params.append(param.detach().numpy().astype("<f4").copy())
            moments.append(opt.state[param]["moment2_buffer"].numpy().astype("<f4").reshape(-1).copy())
        stem = f"{args.method}/{rows}x{cols}"
        files = {
            "init_f32": f"{stem}_init.f32.bin",
            "grads_f32": f"{stem}_grads.f32.bin",
            "params_f32": f"{stem}_params.f32.bin",
            "moment2_f32": f"{stem}_moment2.f32.bin",
        }
        arrays = {
            "init_f32": init,
            "grads_f32": grads,
            "params_f32": np.stack(params),
            "moment2_f32": np.stack(moments),
        }
        for key, array in arrays.items():
            (out / files[key]).write_bytes(np.ascontiguousarray(array).tobytes())
        entries.append(
            {
                "rows": rows,
                "cols": cols,
                "steps": STEPS,
                "lr": LR,
                "weight_decay": WEIGHT_DECAY,
                "momentum": MOMENTUM,
                "nesterov": nesterov,
                "moment2_lines": int(moments[0].size),
                "peer": f"emerging-optimizers {EO_VERSION} AdaptiveMuon(moment2_method='{args.method}')",
                **files,
            }
        )
    print(json.dumps(entries, indent=1))


if __name__ == "__main__":
    main()
