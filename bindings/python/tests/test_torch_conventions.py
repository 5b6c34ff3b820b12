"""The PyTorch adapter keeps torch's conventions (issue 42): grads stay bound whatever the
loop does, QK-clip layouts and maxima are checked where they are given, param groups a
scheduler drives, one optimizer per model, Moonlight's update scale by default.

Skipped without torch; CI sets MUON_REQUIRE_TORCH=1 so that it cannot be skipped there.
"""

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
    from test_torch import batch, config, make_model, run_ranks
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
    if os.environ.get("MUON_REQUIRE_TORCH") == "1":
        raise

STEPS = 5


def loss_of(model, step, rows=slice(None)):
    tokens, targets = batch(step)
    return torch.nn.functional.cross_entropy(model(tokens[rows]), targets[rows])


def run(loop, comm=None, **options):
    """``loop(model, opt, step)`` for STEPS steps on one rank; (grad norms, final params)."""

    def body(comm, world):
        model = make_model()
        opt = Muon(model, comm, config(), lr=0.02, adam_lr=0.01, **options)
        norms = [loop(model, opt, step).grad_norm for step in range(STEPS)]
        opt.synchronize()
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.close()
        return norms, params

    return run_ranks(1, body)[0]


def plain(model, opt, step):
    opt.zero_grad()
    loss_of(model, step).backward()
    return opt.step()


@unittest.skipIf(torch is None, "torch is not installed")
class Grads(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.norms, cls.params = run(plain)

    def assert_same_training(self, loop, **options):
        norms, params = run(loop, **options)
        self.assertEqual(norms, self.norms)
        self.assertTrue(all(n > 0 for n in norms), norms)
        for name, value in self.params.items():
            self.assertTrue(torch.equal(params[name], value), name)

    def test_model_zero_grad_sets_none_and_training_goes_on(self):
        def loop(model, opt, step):
            model.zero_grad()  # set_to_none=True: unbinds every .grad
            loss_of(model, step).backward()
            return opt.step()

        self.assert_same_training(loop)

    def test_zero_grad_between_forward_and_backward(self):
        def loop(model, opt, step):
            loss = loss_of(model, step)
            model.zero_grad()
            loss.backward()
            return opt.step()

        self.assert_same_training(loop)

    def test_opt_zero_grad_set_to_none_keeps_bound_zeros(self):
        def loop(model, opt, step):
            opt.zero_grad(set_to_none=True)
            for p in model.parameters():
                self.assertEqual(float(p.grad.abs().sum()), 0.0)
            loss_of(model, step).backward()
            return opt.step()

        self.assert_same_training(loop)

    def test_replaced_grad_is_taken(self):
        def loop(model, opt, step):
            opt.zero_grad()
            loss_of(model, step).backward()
            for p in model.parameters():
                p.grad = p.grad.clone()  # a hook or a scaler handing back a new tensor
            return opt.step()

        self.assert_same_training(loop)

    def test_accumulation_and_clip_grad_norm(self):
        def loop(model, opt, step):
            model.zero_grad()
            with opt.no_sync():
                (loss_of(model, step, slice(0, 4)) / 2).backward()
            (loss_of(model, step, slice(4, 8)) / 2).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)  # in place, no effect at this bound
            return opt.step()

        norms, params = run(loop)
        # Two half-batch means halved: the whole-batch gradient up to f32 summation order.
        for a, b in zip(norms, self.norms):
            self.assertAlmostEqual(a, b, delta=1e-5 * b)
        for name, value in self.params.items():
            torch.testing.assert_close(params[name], value, rtol=1e-5, atol=5e-6, msg=name)

    def test_grad_scaler(self):
        """A power-of-two loss scale and GradScaler.unscale_ give the unscaled gradient exactly."""
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)

        def loop(model, opt, step):
            model.zero_grad()
            scaler.scale(loss_of(model, step)).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
            scaler.step(opt)
            scaler.update()
            return opt.last_info

        self.assert_same_training(loop)
        self.assertEqual(scaler.get_scale(), 2.0**12)

    def test_overlap_refuses_grads_changed_after_backward(self):
        def clipped(model, opt, step):
            opt.zero_grad()
            loss_of(model, step).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            return opt.step()

        def unset(model, opt, step):
            opt.zero_grad()
            loss_of(model, step).backward()
            model.zero_grad()
            return opt.step()

        for loop, words in ((clipped, "changed in place after backward"), (unset, "set to None or replaced")):
            with self.assertRaises(RuntimeError) as ctx:
                run(loop, overlap_grad_reduce=True)
            self.assertIn("param 'embed.weight'", str(ctx.exception))
            self.assertIn(words, str(ctx.exception))
        self.assert_same_training(plain, overlap_grad_reduce=True)


def attention_model():
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Linear(16, 16, bias=False)
            self.k = torch.nn.Linear(16, 8, bias=False)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            return (self.q(self.norm(x)) @ self.k(x).repeat(1, 2).T).sum()

    torch.manual_seed(3)
    return Attn()


@unittest.skipIf(torch is None, "torch is not installed")
class QkClipChecks(unittest.TestCase):
    LAYOUT = {"q.weight": dict(kind="query", num_heads=4, num_query_groups=2, head_dim=4),
              "k.weight": dict(kind="key", num_heads=4, num_query_groups=2, head_dim=4)}

    def test_layout_checked_at_construction(self):
        with mo.HostGroup(1) as group:
            for qk, words in (
                ({"q.weight": dict(kind="query", num_heads=3, head_dim=4)}, "has 12 rows, the param has 16"),
                ({"k.weight": dict(kind="key", num_heads=4, num_query_groups=3, head_dim=4)}, "does not divide"),
                ({"norm.weight": dict(kind="query", num_heads=4, head_dim=4)}, "routed to ADAMW"),
                ({"q.weight": dict(kind="mla_query", num_heads=4, head_dim=4)}, "rope_dim must be"),
            ):
                with self.assertRaises(ValueError) as ctx:
                    Muon(attention_model(), group[0], qk_clip=qk)
                self.assertIn(f"qk_clip['{next(iter(qk))}']", str(ctx.exception))
                self.assertIn(words, str(ctx.exception))
            opt = Muon(attention_model(), group[0], qk_clip=self.LAYOUT)  # the refusals claimed nothing
            opt.close()

    def test_maxima_checked_at_set_max_logits(self):
        with mo.HostGroup(1) as group:
            model = attention_model()
            opt = Muon(model, group[0], qk_clip=self.LAYOUT)
            for bad in (torch.zeros(0), torch.zeros(3), torch.zeros(6)):
                with self.assertRaises(ValueError) as ctx:
                    opt.set_max_logits("q.weight", bad)
                self.assertIn(f"max_logits has {bad.numel()} values, the layout has num_heads 4", str(ctx.exception))
            with self.assertRaises(TypeError) as ctx:
                opt.set_max_logits("q.weight", torch.zeros(4, dtype=torch.int32))
            self.assertIn("floating dtype", str(ctx.exception))
            with self.assertRaises(ValueError) as ctx:
                opt.set_max_logits("q.weight", torch.zeros(2, 2))
            self.assertIn("expected 1-D", str(ctx.exception))
            opt.set_max_logits("q.weight", torch.full((4,), 200.0))
            opt.zero_grad()
            model(torch.ones(3, 16)).backward()
            before = model.q.weight.detach().clone()
            opt.step()
            opt.synchronize()
            self.assertFalse(torch.equal(before, model.q.weight))
            opt.close()

    def test_binding_qk_clip_checks_lengths(self):
        with mo.HostGroup(1) as group, mo.Optimizer(mo.Config(), group[0]) as opt:
            w = opt.add_param("q", (16, 16), dtype=mo.Dtype.F32)
            opt.finalize()
            for values in ([], [1.0] * 3, [1.0] * 6):
                with self.assertRaises(ValueError) as ctx:
                    opt.qk_clip([mo.QkClip(w, mo.QkKind.QUERY, 4, 4, values)], threshold=100.0)
                self.assertIn(f"max_logits has {len(values)} values, the layout has num_heads 4", str(ctx.exception))
            opt.qk_clip([mo.QkClip(w, mo.QkKind.QUERY, 4, 4, [1.0] * 4)], threshold=100.0)


def one_step_params(comm, **options):
    model = make_model()
    opt = Muon(model, comm, config(), weight_decay=0.0, **options)
    plain(model, opt, 0)
    opt.synchronize()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.close()
    return params


@unittest.skipIf(torch is None, "torch is not installed")
class Groups(unittest.TestCase):
    def test_scheduler_drives_both_groups(self):
        with mo.HostGroup(1) as group:
            model = make_model()
            opt = Muon(model, group[0], config(), lr=0.02, adam_lr=0.01)
            self.assertEqual([g["name"] for g in opt.param_groups], ["muon", "adamw"])
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
            for step in range(5):
                plain(model, opt, step)
                sched.step()
            self.assertAlmostEqual(opt.param_groups[0]["lr"], 0.01)
            self.assertAlmostEqual(opt.param_groups[1]["lr"], 0.005)
            torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: 1.0, lambda s: 0.5])  # one group per route
            plain(model, opt, 5)
            opt.close()

    def test_groups_of_a_route_follow_schedules_of_their_own(self):
        """Two Muon groups scheduled apart (LambdaLR, one factor each) train bit for bit as a run
        whose second group starts at half the lr with the schedule shifted by one step."""
        def groups(fc2_lr):
            return [{"params": ["fc1.weight"], "use_muon": True, "lr": 0.02},
                    {"params": ["fc2.weight"], "use_muon": True, "lr": fc2_lr},
                    {"params": ["embed.weight", "fc1.bias", "norm.weight", "norm.bias"], "use_muon": False}]

        def run(fc2_lr, lambdas):
            with mo.HostGroup(1) as group:
                model = make_model()
                opt = Muon(model, group[0], config(), param_groups=groups(fc2_lr))
                sched = torch.optim.lr_scheduler.LambdaLR(opt, lambdas)
                for step in range(3):
                    plain(model, opt, step)
                    sched.step()
                opt.synchronize()
                params = {n: p.detach().clone() for n, p in model.named_parameters()}
                opt.close()
                return params

        apart = run(0.02, [lambda s: 1.0, lambda s: 0.5 ** (s + 1), lambda s: 1.0])
        halved = run(0.01, [lambda s: 1.0, lambda s: 0.5 ** s, lambda s: 1.0])
        same = run(0.02, [lambda s: 1.0, lambda s: 1.0, lambda s: 1.0])
        for name in apart:
            self.assertTrue(torch.equal(apart[name], halved[name]), name)
        self.assertFalse(torch.equal(apart["fc2.weight"], same["fc2.weight"]))

    def test_adam_lr_reaches_the_library(self):
        with mo.HostGroup(1) as group:
            a = one_step_params(group[0], lr=0.02, adam_lr=0.01)
        with mo.HostGroup(1) as group:
            b = one_step_params(group[0], lr=0.02, adam_lr=0.005)
        self.assertTrue(torch.equal(a["fc1.weight"], b["fc1.weight"]))
        self.assertFalse(torch.equal(a["embed.weight"], b["embed.weight"]))

    def test_own_groups_scale_per_param(self):
        """A Muon group at half the lr: its params move as with that lr alone, bit for bit."""
        groups = [
            {"params": ["fc1.weight"], "use_muon": True, "lr": 0.02},
            {"params": ["fc2.weight"], "use_muon": True, "lr": 0.01},
            {"params": ["embed.weight", "fc1.bias", "norm.weight", "norm.bias"], "use_muon": False, "lr": 0.01},
        ]
        with mo.HostGroup(1) as group:
            mixed = one_step_params(group[0], param_groups=groups)
        with mo.HostGroup(1) as group:
            low = one_step_params(group[0], lr=0.01, adam_lr=0.01)
        with mo.HostGroup(1) as group:
            high = one_step_params(group[0], lr=0.02, adam_lr=0.01)
        self.assertTrue(torch.equal(mixed["fc2.weight"], low["fc2.weight"]))
        self.assertTrue(torch.equal(mixed["fc1.weight"], high["fc1.weight"]))
        with mo.HostGroup(1) as group:
            scaled = one_step_params(group[0], param_groups=[dict(groups[0], lr_scale=0.5), groups[1], groups[2]])
        self.assertTrue(torch.equal(scaled["fc1.weight"], low["fc1.weight"]), "lr_scale halves the lr")

    def test_group_refusals(self):
        rest = ["embed.weight", "fc1.bias", "norm.weight", "norm.bias"]
        cases = (
            ([{"params": ["fc1.weight", "fc2.weight"], "use_muon": True}], "in none: " + repr(rest)),
            ([{"params": ["fc1.weight", "fc2.weight", "norm.weight"], "use_muon": True},
              {"params": ["embed.weight", "fc1.bias", "norm.bias"], "use_muon": False}], "routes 'norm.weight'"),
            ([{"params": ["fc1.weight", "fc2.weight"]}], "['use_muon']: required"),
            ([{"params": ["fc1.weight", "fc2.weight"], "use_muon": True, "betas": (0.9, 0.9)}], "unknown keys ['betas']"),
            ([{"params": ["fc1.weight", "fc2.weight"], "use_muon": True, "lr": -1.0}], "['lr']: must be a finite"),
        )
        with mo.HostGroup(1) as group:
            for groups, words in cases:
                with self.assertRaises(ValueError) as ctx:
                    Muon(make_model(), group[0], config(), param_groups=groups)
                self.assertIn(words, str(ctx.exception))


@unittest.skipIf(torch is None, "torch is not installed")
class Ownership(unittest.TestCase):
    def test_one_optimizer_per_model_and_close_removes_hooks(self):
        with mo.HostGroup(1) as group, mo.HostGroup(1) as other:
            model = make_model()
            first = Muon(model, group[0], config())
            with self.assertRaises(ValueError) as ctx:
                Muon(model, other[0], config())
            self.assertIn("param 'embed.weight' is already trained by another muon_opt.torch.Muon", str(ctx.exception))
            first.close()
            for m in model.modules():
                self.assertEqual(len(m._forward_pre_hooks), 0, m)
            for p in model.parameters():
                self.assertFalse(getattr(p, "_post_accumulate_grad_hooks", None), "grad hook left")
        with mo.HostGroup(1) as group:
            second = Muon(model, group[0], config())
            plain(model, second, 0)
            second.close()


@unittest.skipIf(torch is None, "torch is not installed")
class Defaults(unittest.TestCase):
    def test_moonlight_scale_one_lr(self):
        """Default: update RMS ≈ 0.2 · lr on a Muon matrix (AdamW's), one lr for both groups."""
        with mo.HostGroup(1) as group:
            model = make_model()
            opt = Muon(model, group[0], weight_decay=0.0)
            self.assertEqual(opt.config.muon_extra_scale_factor, mo._capi.c_float(0.2).value)
            self.assertEqual(opt.param_groups[0]["lr"], opt.param_groups[1]["lr"])
            before = model.fc1.weight.detach().clone()
            plain(model, opt, 0)
            opt.synchronize()
            rms = float((model.fc1.weight.detach() - before).square().mean().sqrt()) / opt.param_groups[0]["lr"]
            self.assertGreater(rms, 0.1)
            self.assertLess(rms, 0.3)
            opt.close()


if __name__ == "__main__":
    unittest.main()
