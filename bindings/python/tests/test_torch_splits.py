"""The PyTorch adapter's ``splits``: a fused matrix declared with its components is updated as
``torch.optim.Muon`` updates the same components as separate parameters — Megatron's QKV per
query group (rows ``[q|k|v]`` per group; the q rows of every group form one matrix, as
Megatron's ``split_qkv`` makes them) and a flat split of contiguous blocks — and differs from the
whole matrix orthogonalized at once.

Skipped without torch (or a torch without ``torch.optim.Muon``, added in 2.9); CI installs torch
2.15 and sets MUON_REQUIRE_TORCH=1.
"""

import os
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import muon_opt as mo  # noqa: E402

try:
    import torch
    from muon_opt.torch import Muon
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
    if os.environ.get("MUON_REQUIRE_TORCH") == "1":
        raise

COLS, GROUPS, Q, K, V = 32, 3, 8, 4, 4
ROWS = GROUPS * (Q + K + V)
LR, WD, STEPS = 0.02, 0.1, 3


def flat_blocks():
    """Rows of every contiguous block, group by group: q, k, v."""
    out, row = [], 0
    for _ in range(GROUPS):
        for size in (Q, K, V):
            out.append(list(range(row, row + size)))
            row += size
    return out


def grouped_components():
    """Rows of the q, k and v matrices: each gathers its block of every group."""
    blocks = flat_blocks()
    return [sum(blocks[c::3], []) for c in range(3)]


def grads():
    g = torch.Generator().manual_seed(7)
    return [torch.randn(ROWS, COLS, generator=g) for _ in range(STEPS)]


def initial():
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(3)) * 0.1


def config():
    # torch.optim.Muon's defaults: (3.4445, -4.775, 2.0315) every step, Nesterov, lr scaled by
    # sqrt(max(1, rows/cols)), eps 1e-7. Its momentum is B = mu*B + g where ours is an EMA:
    # (1 - mu)·B, which the Newton–Schulz normalization removes.
    return mo.Config(
        muon_coefficient_set=mo.Coefficients.SIMPLE,
        muon_nesterov=True,
        muon_scale_mode=mo.ScaleMode.SHAPE_SCALING,
        muon_ns_eps=1e-7,
        muon_ns_precision=mo.NsPrecision.F32,
        clip_grad=0.0,
    )


def ours(splits):
    model = torch.nn.Linear(COLS, ROWS, bias=False)
    with torch.no_grad():
        model.weight.copy_(initial())
    with mo.HostGroup(1) as group:
        opt = Muon(model, group[0], config(), lr=LR, weight_decay=WD, splits=splits)
        for g in grads():
            opt.zero_grad()
            (model.weight * g).sum().backward()  # d/dW = g
            assert not opt.step().skipped
        opt.synchronize()
        out = model.weight.detach().clone()
        opt.close()
    return out


def reference(components):
    """torch.optim.Muon on every component (a list of rows) as a parameter of its own."""
    w = initial()
    parts = [torch.nn.Parameter(w[rows].clone()) for rows in components]
    opt = torch.optim.Muon(parts, lr=LR, weight_decay=WD)
    for g in grads():
        for p, rows in zip(parts, components):
            p.grad = g[rows].clone()
        opt.step()
    out = torch.empty(ROWS, COLS)
    for p, rows in zip(parts, components):
        out[rows] = p.detach()
    return out


# torch.optim.Muon runs Newton–Schulz in bf16, ours in f32 here: within bf16 rounding.
TOLERANCE = 2e-3


def max_diff(a, b):
    return float((a - b).abs().max())


@unittest.skipIf(torch is None or not hasattr(torch.optim, "Muon"), "torch with torch.optim.Muon is not installed")
class FusedSplits(unittest.TestCase):
    def test_qkv_per_query_group_matches_torch_muon_on_the_q_k_v_matrices(self):
        expected = reference(grouped_components())
        self.assertLess(max_diff(ours({"weight": ((Q, K, V), GROUPS)}), expected), TOLERANCE)
        self.assertGreater(max_diff(ours(None), expected), 5 * TOLERANCE, "the split made no difference")

    def test_flat_sizes_match_torch_muon_on_contiguous_blocks(self):
        expected = reference(flat_blocks())
        flat = ours({"weight": [Q, K, V] * GROUPS})
        self.assertLess(max_diff(flat, expected), TOLERANCE)
        grouped = ours({"weight": ((Q, K, V), GROUPS)})
        self.assertGreater(max_diff(flat, grouped), 3 * TOLERANCE, "groups made no difference")

    def test_bad_splits_are_refused_by_name(self):
        model = torch.nn.Linear(COLS, ROWS, bias=False)
        with mo.HostGroup(1) as group:
            with self.assertRaisesRegex(ValueError, r"splits names no parameter of the module: \['qkv'\]"):
                Muon(model, group[0], config(), splits={"qkv": (16, 32)})
            with self.assertRaisesRegex(TypeError, r"splits\['weight'\]: expected row sizes"):
                Muon(model, group[0], config(), splits={"weight": ("a", "b")})
            with self.assertRaisesRegex(mo.MuonError, "split"):
                Muon(model, group[0], config(), splits={"weight": (7, 7)})


if __name__ == "__main__":
    unittest.main()
