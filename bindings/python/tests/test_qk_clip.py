"""QK-clip from Python: the ctypes binding on the host backend (the step clips the owner's
master and the copy; bad requests raise and change nothing), and the PyTorch adapter on a toy
attention whose logits are pushed over tau: after the clip the max logit is tau within 1e-5.

The PyTorch part is skipped without torch; CI installs it and sets MUON_REQUIRE_TORCH=1.
"""

import array
import math
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

ROWS, COLS = 64, 32  # a fused QKV of 2 query groups of 2 heads, head dim 8: [16 q | 8 k | 8 v] x 2


def init_values(n):
    return array.array("f", [math.sin(0.37 * i) * 0.1 for i in range(n)])


def qkv_clip(pid, maxima, num_heads=4):
    return mo.QkClip(
        param_id=pid, kind=mo.QkKind.FUSED_QKV, num_heads=num_heads, head_dim=8, num_query_groups=2, max_logits=maxima
    )


class Binding(unittest.TestCase):
    def setUp(self):
        self.group = mo.HostGroup(1)
        self.opt = mo.Optimizer(mo.Config(bucket_size=4096), self.group[0])
        self.qkv = self.opt.add_param(
            "attn.qkv.weight",
            (ROWS, COLS),
            dtype=mo.Dtype.F32,
            split_sizes=(16, 8, 8),
            split_groups=2,
            init=init_values(ROWS * COLS),
        )
        self.norm = self.opt.add_param("norm.weight", (COLS,), dtype=mo.Dtype.F32)
        self.opt.finalize()
        self.view = self.opt.param_view(self.qkv)

    def tearDown(self):
        self.opt.close()
        self.group.close()

    def step_without_update(self):
        """A step with zero gradients and learning rates: only the clip changes the params."""
        self.opt.zero_grad()
        for pid in (self.norm, self.qkv):
            self.opt.grad_ready(pid)
        self.opt.step(lr=0.0, adam_lr=0.0)

    def test_the_step_clips_the_query_and_key_rows_of_groups_over_tau(self):
        before = list(self.view.data)
        # Group 0: max 40 > tau = 10, eta = 1/4, alpha = 1/2: query and key rows x 1/2 exactly.
        self.opt.qk_clip([qkv_clip(self.qkv, [40.0, 3.0, 9.0, 9.5])], threshold=10.0, alpha=0.5)
        self.step_without_update()
        after = list(self.view.data)
        for i, (b, a) in enumerate(zip(before, after)):
            self.assertEqual(a, b * 0.5 if i < 24 * COLS else b, f"element {i}")
        self.step_without_update()  # the clip was consumed by the step
        self.assertEqual(list(self.view.data), after)

    def test_bad_requests_raise_and_change_nothing(self):
        before = list(self.view.data)
        bad = [
            ([qkv_clip(self.qkv, [40.0, 3.0, 9.0], num_heads=3)], 10.0, "num_query_groups 2 does not divide num_heads 3"),
            ([qkv_clip(self.qkv, [40.0, float("nan"), 9.0, 9.5])], 10.0, "max_logits[1] is NaN"),
            ([qkv_clip(self.qkv, [40.0, 3.0, 9.0, 9.5])], 0.0, "threshold 0"),
            ([qkv_clip(self.norm, [40.0, 3.0, 9.0, 9.5])], 10.0, "not an attention matrix"),
        ]
        for clips, tau, message in bad:
            with self.assertRaises(mo.MuonError) as ctx:
                self.opt.qk_clip(clips, threshold=tau)
            self.assertEqual(ctx.exception.status, mo.Status.INVALID_ARGUMENT)
            self.assertIn("muon_optimizer_qk_clip", str(ctx.exception))
            self.assertIn(message, str(ctx.exception))
        self.step_without_update()
        self.assertEqual(list(self.view.data), before)


HEADS, HEAD_DIM, WIDTH, TOKENS = 2, 4, 8, 6


@unittest.skipIf(torch is None, "torch is not installed")
class TorchToyAttention(unittest.TestCase):
    def test_the_clip_brings_the_max_logit_to_tau(self):
        class Attention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.q = torch.nn.Linear(WIDTH, HEADS * HEAD_DIM, bias=False)
                self.k = torch.nn.Linear(WIDTH, HEADS * HEAD_DIM, bias=False)

            def max_logits(self, x):
                q = self.q(x).view(TOKENS, HEADS, HEAD_DIM).transpose(0, 1)
                k = self.k(x).view(TOKENS, HEADS, HEAD_DIM).transpose(0, 1)
                logits = q @ k.transpose(1, 2) / math.sqrt(HEAD_DIM)
                return logits.amax(dim=(1, 2))

        torch.manual_seed(0)
        model = Attention()
        with torch.no_grad():
            model.q.weight.mul_(8.0)  # push the logits up
        x = torch.randn(TOKENS, WIDTH, generator=torch.Generator().manual_seed(1))
        layout = dict(num_heads=HEADS, head_dim=HEAD_DIM)
        with mo.HostGroup(1) as group:
            opt = Muon(
                model,
                group[0],
                mo.Config(bucket_size=4096),
                lr=0.0,
                weight_decay=0.0,
                adam_lr=0.0,
                adam_weight_decay=0.0,
                qk_clip={"q.weight": dict(kind="query", **layout), "k.weight": dict(kind="key", **layout)},
                qk_clip_alpha=0.5,
            )
            opt.zero_grad()
            with torch.no_grad():
                maxima = model.max_logits(x)
            tau = float(maxima.max()) * 0.5
            self.assertGreater(float(maxima.max()), tau)
            opt.qk_clip_threshold = tau
            opt.set_max_logits("q.weight", maxima)
            opt.set_max_logits("k.weight", maxima)
            loss = model.max_logits(x).sum()
            loss.backward()
            opt.step()  # lr 0: only the clip changes the weights
            opt.synchronize()
            with torch.no_grad():
                after = model.max_logits(x)
            for h in range(HEADS):
                if float(maxima[h]) > tau:
                    self.assertLess(abs(float(after[h]) - tau) / tau, 1e-5, f"head {h}: {after[h]} vs tau {tau}")
                else:
                    self.assertEqual(float(after[h]), float(maxima[h]), f"head {h} under tau changed")
            opt.close()


if __name__ == "__main__":
    unittest.main()
