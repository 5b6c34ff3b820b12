"""Megatron-LM's defaults through the Python binding and the PyTorch adapter (issue 40): the
duplicated TP mode and Megatron's weight-decay rule by default, the flags that override the
rule, and the decoupled learning rate of the embedding and output params (``--decoupled-lr``).

The torch tests are skipped without torch; CI sets MUON_REQUIRE_TORCH=1 so that they cannot be
skipped there.
"""

import array
import os
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import muon_opt as mo  # noqa: E402

try:
    import torch
    from muon_opt.torch import Muon
    from test_torch import config, make_model
    from test_torch_conventions import plain
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
    if os.environ.get("MUON_REQUIRE_TORCH") == "1":
        raise

# (name, shape, flags) of a small model: an embedding, a Muon matrix, a bias, a norm.
MODEL = (
    ("embedding.weight", (16, 4), mo.ParamFlag.EMBEDDING_OR_OUTPUT),
    ("fc.weight", (8, 4), 0),
    ("fc.bias", (8,), 0),
    ("norm.weight", (4,), 0),
)


def train(cfg, model=MODEL, grads=True, **step):
    """Every param's bytes after two steps of a one-rank optimizer (f32, values 1 + i/64) with
    ``step`` as the step's keywords; zero gradients unless ``grads``."""
    with mo.HostGroup(1) as group, mo.Optimizer(cfg, group[0]) as opt:
        for name, shape, flags in model:
            n = 1
            for d in shape:
                n *= d
            opt.add_param(name, shape, dtype=mo.Dtype.F32, flags=flags,
                          init=array.array("f", [1.0 + i / 64.0 for i in range(n)]))
        opt.finalize()
        views = [opt.param_view(p) for p in range(len(model))]
        for s in range(2):
            opt.zero_grad()
            for p, v in enumerate(views):
                values = [((i * 5 + p * 3 + s) % 7 - 3) / 16.0 if grads else 0.0 for i in range(v.numel)]
                v.grad[:] = array.array("f", values)
            opt.step(**dict(dict(lr=0.02, adam_lr=0.01, weight_decay=0.1, adam_weight_decay=0.5), **step))
        return [v.data.tobytes() for v in views]


class Binding(unittest.TestCase):
    def test_defaults_are_megatrons(self):
        cfg = mo.Config()
        self.assertEqual(cfg.muon_tp_mode, mo.TpMode.DUPLICATED)
        self.assertEqual(cfg.weight_decay_rule, mo.WeightDecayRule.MEGATRON)
        self.assertEqual(mo.ParamFlag.WEIGHT_DECAY, 1 << 10)

    def test_weight_decay_spares_1d_params_and_biases_unless_flagged(self):
        """With zero gradients a param moves only by its decay: Megatron's rule spares the bias
        and the norm; the flagged rule decays every param; WEIGHT_DECAY decays one."""
        start = train(mo.Config(), grads=False, lr=0.0, adam_lr=0.0)
        moved = lambda after: [a != b for a, b in zip(after, start)]  # noqa: E731
        self.assertEqual(moved(train(mo.Config(), grads=False)), [True, True, False, False])
        flagged = mo.Config(weight_decay_rule=mo.WeightDecayRule.FLAGGED)
        self.assertEqual(moved(train(flagged, grads=False)), [True, True, True, True])
        model = MODEL[:3] + (("norm.weight", (4,), mo.ParamFlag.WEIGHT_DECAY),)
        self.assertEqual(moved(train(mo.Config(), model=model, grads=False)), [True, True, False, True])
        both = MODEL[:3] + (("norm.weight", (4,), mo.ParamFlag.WEIGHT_DECAY | mo.ParamFlag.NO_WEIGHT_DECAY),)
        with self.assertRaises(mo.MuonError) as ctx:
            train(mo.Config(), model=both)
        self.assertEqual(ctx.exception.status, mo.Status.INVALID_PARAM)
        self.assertIn("NO_WEIGHT_DECAY and WEIGHT_DECAY both set", str(ctx.exception))

    def test_decoupled_lr_steps_the_embedding_alone(self):
        cfg = mo.Config(clip_grad=0.0)
        got = train(cfg, decoupled_lr=0.03)
        at_adam_lr = train(cfg)
        at_decoupled_lr = train(cfg, adam_lr=0.03)
        self.assertEqual(got[0], at_decoupled_lr[0])
        self.assertNotEqual(got[0], at_adam_lr[0])
        self.assertEqual(got[1:], at_adam_lr[1:])
        with self.assertRaises(mo.MuonError) as ctx:
            train(cfg, decoupled_lr=-1.0)
        self.assertEqual(ctx.exception.status, mo.Status.OUT_OF_RANGE)
        self.assertIn("args->decoupled_lr -1 must be finite and >= 0", str(ctx.exception))


def one_step(**options):
    with mo.HostGroup(1) as group:
        model = make_model()
        opt = Muon(model, group[0], config(), **dict(dict(lr=0.02, adam_lr=0.01), **options))
        names = [g["name"] for g in opt.param_groups]
        plain(model, opt, 0)
        opt.synchronize()
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.close()
        return names, params


@unittest.skipIf(torch is None, "torch is not installed")
class Torch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)

    def test_decoupled_lr_is_a_group_of_the_embedding_and_output_params(self):
        """``decoupled_lr``: the tied embedding/head steps at it, bit for bit as when it is the
        AdamW lr; every other param as without it."""
        names, got = one_step(decoupled_lr=0.005)
        self.assertEqual(names, ["muon", "adamw", "decoupled"])
        _, plain_run = one_step()
        _, at_decoupled = one_step(adam_lr=0.005)
        self.assertTrue(torch.equal(got["embed.weight"], at_decoupled["embed.weight"]))
        self.assertFalse(torch.equal(got["embed.weight"], plain_run["embed.weight"]))
        for name in ("fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight"):
            self.assertTrue(torch.equal(got[name], plain_run[name]), name)
        with mo.HostGroup(1) as group:
            with self.assertRaises(ValueError) as ctx:
                Muon(make_model(), group[0], config(), decoupled_lr=0.005,
                     param_groups=[{"params": [p for _, p in make_model().named_parameters()], "use_muon": False}])
            self.assertIn("decoupled_lr: with param_groups", str(ctx.exception))

    def test_weight_decay_follows_the_rule_unless_no_weight_decay_decides(self):
        """By default the library's rule spares the 1-D params, as the adapter's former
        ``p.dim() < 2`` did (bit for bit); ``no_weight_decay`` decides every param when given."""
        _, rule = one_step()
        _, by_dim = one_step(no_weight_decay=lambda name, p: p.dim() < 2)
        _, decay_all = one_step(no_weight_decay=lambda name, p: False)
        for name in rule:
            self.assertTrue(torch.equal(rule[name], by_dim[name]), name)
        self.assertFalse(torch.equal(rule["norm.weight"], decay_all["norm.weight"]))
        self.assertTrue(torch.equal(rule["fc1.weight"], decay_all["fc1.weight"]))


if __name__ == "__main__":
    unittest.main()
