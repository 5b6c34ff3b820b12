#!/usr/bin/env python3
"""Peer script: runs Emerging-Optimizers' published Newton–Schulz with its coefficient sets.

`emerging_optimizers.orthogonalized_optimizers.muon_utils.newton_schulz` of
NVIDIA-NeMo/Emerging-Optimizers v0.4.0 (git tag v0.4.0, commit
925e1bfe32b37f5e3d52afdbeb24cfaf2df85c00, the first release with `cubic5`), imported unchanged
from a directory DIR holding the tag's `emerging_optimizers/` (for instance
`git archive v0.4.0 emerging_optimizers | tar -x -C DIR`) and the PyPI package `absl-py`. As
for the NorMuon peer script, `typing.override` (Python 3.12) is set to the identity before the
import. `torch.set_float32_matmul_precision("highest")` keeps every product in float32 (the
library's `muon_ns_precision = f32`); `eps=1e-7` is the library's default `muon_ns_eps`
(v0.4.0 defaults to 1e-15; on these inputs the norm is far above either). Each set runs past
the end of its table where it has one to continue (`aol` cycled; `cans`, `deepseekv4`
repeating the last triple), `cubic5` its fixed 5 steps, and a `custom` table cycled. Nothing
of the package is stored in this repository.

Usage (from the repository root):
    PYTHONPATH=DIR:~/.cache/muon_py/torch-2.15.0 python3 \
        tests/data/golden/peer/coefficients_emerging_optimizers.py tests/data/golden

Writes `coefficients/*.bin` under the output directory and prints the manifest's
`coefficients` entries as JSON.
"""

import argparse
import json
import pathlib
import typing

typing.override = lambda f: f  # Python 3.12's typing.override, an identity decorator

import numpy as np  # noqa: E402
import torch  # noqa: E402
from emerging_optimizers import __version__ as EO_VERSION  # noqa: E402
from emerging_optimizers.orthogonalized_optimizers.muon_utils import newton_schulz  # noqa: E402

SEED = 20261129
EPS = 1e-7
# (set, steps, custom table)
RUNS = [
    ("cans", 6, None),
    ("aol", 6, None),
    ("cubic5", 5, None),
    ("deepseekv4", 11, None),
    ("custom", 7, [(3.5, -4.5, 2.0), (3.0, -3.2, 1.2), (2.0, -1.5, 0.5)]),
]
SHAPES = [(32, 48), (48, 24)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("highest")
    out = pathlib.Path(args.out_dir)
    (out / "coefficients").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    entries = []
    for rows, cols in SHAPES:
        x = rng.standard_normal((rows, cols)).astype("<f4")
        stem = f"coefficients/{rows}x{cols}"
        input_file = f"{stem}_input.f32.bin"
        (out / input_file).write_bytes(x.tobytes())
        for name, steps, table in RUNS:
            y = newton_schulz(
                torch.from_numpy(x.copy()),
                steps,
                coefficient_type=name,
                custom_coefficient_sets=table,
                eps=EPS,
            )
            output_file = f"{stem}_{name}.f32.bin"
            (out / output_file).write_bytes(y.numpy().astype("<f4").tobytes())
            entries.append(
                {
                    "rows": rows,
                    "cols": cols,
                    "coefficients": name,
                    "steps": steps,
                    "custom": table or [],
                    "peer": f"emerging-optimizers {EO_VERSION} newton_schulz(coefficient_type={name!r})",
                    "input_f32": input_file,
                    "output_f32": output_file,
                }
            )
    print(json.dumps(entries, indent=1))


if __name__ == "__main__":
    main()
