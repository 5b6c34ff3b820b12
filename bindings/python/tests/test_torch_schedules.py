"""Momentum and betas that a scheduler drives through the PyTorch adapter (issue 42): every step
passes the Muon groups' ``momentum`` and the AdamW groups' ``betas`` / ``eps`` to the library as
the step's overrides of the config.

Skipped without torch; CI sets MUON_REQUIRE_TORCH=1 so that it cannot be skipped there.
"""

import array
import ctypes
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
    from test_torch import VOCAB, batch, make_model
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
    if os.environ.get("MUON_REQUIRE_TORCH") == "1":
        raise

STEPS = 6


def f32(value):
    return ctypes.c_float(value).value


def config(**fields):
    return mo.Config(bucket_size=512, muon_ns_precision=mo.NsPrecision.F32, vocab_size=VOCAB,
                     collective_timeout_ms=30000, **fields)


def run(loop, cfg=None, steps=STEPS):
    """One rank: ``loop(opt, step)`` sets the groups before each step (a scheduler may step
    after it); returns (the groups' values each step used, the final params)."""
    with mo.HostGroup(1) as group:
        model = make_model()
        opt = Muon(model, group[0], cfg or config(), lr=0.02, adam_lr=0.01)
        used = []
        for step in range(steps):
            after = loop(opt, step)
            opt.zero_grad()
            tokens, targets = batch(step)
            torch.nn.functional.cross_entropy(model(tokens), targets).backward()
            assert not opt.step().skipped
            used.append([(g["use_muon"], g["lr"], g["momentum"], tuple(g["betas"]), g["eps"])
                         for g in opt.param_groups])
            if after is not None:
                after()
        opt.synchronize()
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.close()
        return used, params


def assert_same(case, a, b):
    for name in a:
        case.assertTrue(torch.equal(a[name], b[name]), name)


@unittest.skipIf(torch is None, "torch is not installed")
class Schedules(unittest.TestCase):
    def test_one_cycle_drives_momentum_and_betas(self):
        """OneCycleLR(cycle_momentum=True) cycles ``betas[0]`` of every group (the defaults carry
        betas): the Muon momentum and AdamW β1 follow it, bit for bit as a run that sets each
        step's values itself — the Muon group's ``momentum`` (a Moonlight-style momentum
        schedule), the AdamW group's ``betas`` — and unlike a run at the config's values."""
        scheds = {}

        def one_cycle(opt, step):
            if step == 0:
                scheds["s"] = torch.optim.lr_scheduler.OneCycleLR(
                    opt, max_lr=[0.02, 0.01], total_steps=STEPS, cycle_momentum=True, base_momentum=0.8,
                    max_momentum=0.95)
            return scheds["s"].step

        scheduled, params = run(one_cycle)
        for groups in scheduled:
            for use_muon, _, momentum, betas, _ in groups:
                self.assertEqual(momentum, betas[0], "momentum and betas[0] are one value")
        muon_momenta = [groups[0][2] for groups in scheduled]
        self.assertGreater(len(set(muon_momenta)), 3, f"cycled: {muon_momenta}")
        self.assertEqual(muon_momenta[0], 0.95)

        def by_hand(opt, step):
            for group, (use_muon, lr, momentum, betas, _) in zip(opt.param_groups, scheduled[step]):
                group["lr"] = lr
                if use_muon:
                    group["momentum"] = momentum
                else:
                    group["betas"] = betas

        stepwise, reference = run(by_hand)
        self.assertEqual(stepwise, scheduled)
        assert_same(self, params, reference)

        def lr_only(opt, step):
            for group, (_, lr, _, _, _) in zip(opt.param_groups, scheduled[step]):
                group["lr"] = lr

        _, constant = run(lr_only)
        self.assertFalse(torch.equal(params["fc1.weight"], constant["fc1.weight"]), "Muon follows the momentum")
        self.assertFalse(torch.equal(params["embed.weight"], constant["embed.weight"]), "AdamW follows β1")

    def test_group_values_equal_a_config_of_them(self):
        """Groups holding μ, β1, β2 and ε train bit for bit as an optimizer whose config holds
        them (the overrides reach the library as its config values would)."""
        values = dict(muon_momentum=0.85, adam_beta1=0.8, adam_beta2=0.95, adam_eps=1e-6)

        def set_groups(opt, step):
            for group in opt.param_groups:
                if group["use_muon"]:
                    group["momentum"] = values["muon_momentum"]
                else:
                    group["betas"] = (values["adam_beta1"], values["adam_beta2"])
                    group["eps"] = values["adam_eps"]

        _, by_groups = run(set_groups, steps=3)
        used, by_config = run(lambda opt, step: None, cfg=config(**values), steps=3)
        assert_same(self, by_groups, by_config)
        muon, adamw = used[0]
        self.assertEqual((muon[2], adamw[3], adamw[4]), (f32(0.85), (f32(0.8), f32(0.95)), f32(1e-6)),
                         "a group starts with its route's values from the config")
        _, by_default = run(lambda opt, step: None, steps=3)
        self.assertFalse(torch.equal(by_groups["fc1.weight"], by_default["fc1.weight"]))

    def test_refusals_name_the_group_and_change_nothing(self):
        groups = [
            {"params": ["fc1.weight"], "use_muon": True},
            {"params": ["fc2.weight"], "use_muon": True},
            {"params": ["embed.weight", "fc1.bias", "norm.weight", "norm.bias"], "use_muon": False},
        ]
        cases = (
            (lambda g: g[1].update(momentum=0.9),
             "param_groups[1]['momentum'] is 0.9 but param_groups[0]['momentum'] is 0.949999988079071: the library "
             "steps every Muon param with one value"),
            (lambda g: g[0].update(momentum=1.0), "param_groups[0]['momentum'] is 1.0; it must be in [0, 1)"),
            (lambda g: g[2].update(betas=(0.9, float("nan"))), "param_groups[2]['betas'][1] is nan; it must be in [0, 1)"),
            (lambda g: g[2].update(betas=0.9), "param_groups[2]['betas']: expected (beta1, beta2)"),
            (lambda g: g[2].update(eps=0.0), "param_groups[2]['eps'] is 0.0; it must be finite and > 0"),
            (lambda g: g[0].update(nesterov=True), "param_groups[0]['nesterov'] is True, but the library fixes it"),
        )
        with mo.HostGroup(1) as group:
            model = make_model()
            opt = Muon(model, group[0], config(), param_groups=groups)
            for edit, words in cases:
                saved = [dict(g) for g in opt.param_groups]
                before = {n: p.detach().clone() for n, p in model.named_parameters()}
                edit(opt.param_groups)
                opt.zero_grad()
                tokens, targets = batch(0)
                torch.nn.functional.cross_entropy(model(tokens), targets).backward()
                with self.assertRaises(ValueError) as ctx:
                    opt.step()
                self.assertIn(words, str(ctx.exception))
                self.assertIsNone(opt.last_info, "no step was taken")
                opt.synchronize()
                assert_same(self, before, {n: p.detach().clone() for n, p in model.named_parameters()})
                for g, s in zip(opt.param_groups, saved):
                    g.clear()
                    g.update(s)
            opt.step()
            self.assertEqual(opt.last_info.step, 1)
            opt.close()


class Binding(unittest.TestCase):
    def test_step_overrides_equal_a_config_of_them(self):
        """``Optimizer.step(muon_momentum=…, adam_beta1=…)`` steps as an optimizer configured
        with those values; an override without lr, an unknown one or a bad value is refused."""

        def train(cfg, **overrides):
            with mo.HostGroup(1) as group, mo.Optimizer(cfg, group[0]) as opt:
                opt.add_param("w", (8, 4), dtype=mo.Dtype.F32, init=array.array("f", [0.01 * i for i in range(32)]))
                opt.add_param("b", (8,), dtype=mo.Dtype.F32, init=array.array("f", [0.1] * 8))
                opt.finalize()
                views = [opt.param_view(p) for p in range(2)]
                for step in range(3):
                    opt.zero_grad()
                    for p, v in enumerate(views):
                        v.grad[:] = array.array("f", [((i * 5 + p + step) % 7 - 3) / 64.0 for i in range(v.numel)])
                        opt.grad_ready(p)
                    opt.step(lr=0.02, adam_lr=0.01, **overrides)
                return [v.data.tobytes() for v in views]

        values = dict(muon_momentum=0.5, adam_beta1=0.7, adam_beta2=0.9, adam_eps=1e-5)
        self.assertEqual(train(mo.Config(clip_grad=0.0), **values), train(mo.Config(clip_grad=0.0, **values)))
        self.assertNotEqual(train(mo.Config(clip_grad=0.0), **values), train(mo.Config(clip_grad=0.0)))
        with mo.HostGroup(1) as group, mo.Optimizer(mo.Config(), group[0]) as opt:
            opt.add_param("w", (8, 4), dtype=mo.Dtype.F32)
            opt.finalize()
            with self.assertRaises(ValueError):
                opt.step(muon_momentum=0.5)
            with self.assertRaises(TypeError):
                opt.step(lr=0.02, adam_lr=0.01, momentum=0.5)
            with self.assertRaises(mo.MuonError) as ctx:
                opt.step(lr=0.02, adam_lr=0.01, adam_beta2=1.0)
            self.assertEqual(ctx.exception.status, mo.Status.OUT_OF_RANGE)
            self.assertIn("args->adam_beta2 1 is outside [0, 1)", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
