"""The PyTorch adapter on the host backend: a small nn.Module trained on 2 ranks (threads)
matches the same model trained on 1 rank with the whole batch.

Skipped without torch; CI installs it and sets MUON_REQUIRE_TORCH=1 so that it cannot be
skipped there.
"""

import os
import sys
import tempfile
import threading
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

VOCAB, WIDTH, BATCH, STEPS = 40, 16, 8, 6


_SEED_LOCK = threading.Lock()  # torch's default generator is one per process, shared by the rank threads


def make_model():
    """The same model on every rank: seeded, built under the lock."""

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, WIDTH)
            self.fc1 = torch.nn.Linear(WIDTH, 2 * WIDTH)
            self.norm = torch.nn.LayerNorm(2 * WIDTH)
            self.fc2 = torch.nn.Linear(2 * WIDTH, WIDTH, bias=False)
            self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
            self.head.weight = self.embed.weight  # tied: one parameter

        def forward(self, tokens):
            h = self.embed(tokens)
            h = h + self.fc2(torch.relu(self.norm(self.fc1(h))))
            return self.head(h)

    with _SEED_LOCK:
        torch.manual_seed(0)
        return TinyLM()


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (BATCH,), generator=g)
    return tokens, (tokens * 7 + 3) % VOCAB


def config(mode=mo.CommMode.EAGER):
    return mo.Config(
        bucket_size=512,
        muon_ns_precision=mo.NsPrecision.F32,
        vocab_size=VOCAB,
        collective_timeout_ms=30000,
        host_comm_mode=mode,
    )


def train(comm, world, mode=mo.CommMode.EAGER, **options):
    """One rank: rank r takes its 1/world slice of every batch; returns the losses and the
    final params by name. ``options``: more keywords of ``Muon``."""
    model = make_model()
    opt = Muon(model, comm, config(mode), lr=0.02, adam_lr=0.01, weight_decay=0.0, adam_weight_decay=0.0, **options)
    r, share = comm.rank, BATCH // world
    losses = []
    for step in range(STEPS):
        tokens, targets = batch(step)
        opt.zero_grad()
        mine = slice(r * share, (r + 1) * share)
        with opt.no_sync():  # two micro-batches: the first only accumulates
            half = share // 2
            first = slice(mine.start, mine.start + half)
            loss_a = torch.nn.functional.cross_entropy(model(tokens[first]), targets[first]) / 2
            loss_a.backward()
        second = slice(mine.start + share // 2, mine.stop)
        loss_b = torch.nn.functional.cross_entropy(model(tokens[second]), targets[second]) / 2
        loss_b.backward()
        info = opt.step()
        assert not info.skipped, info
        losses.append(float(loss_a.detach() + loss_b.detach()))
    opt.synchronize()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    routes = opt.routes()
    opt.close()
    return losses, params, routes


SEQ = 6


def make_transformer():
    """A two-block causal transformer without biases or affine norms (so each module's params
    lie in one bucket) and an untied output head; the same on every rank."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH, bias=False)
            self.proj = torch.nn.Linear(WIDTH, WIDTH, bias=False)
            self.fc1 = torch.nn.Linear(WIDTH, 2 * WIDTH, bias=False)
            self.fc2 = torch.nn.Linear(2 * WIDTH, WIDTH, bias=False)

        def forward(self, h):
            norm = torch.nn.functional.layer_norm
            q, k, v = self.qkv(norm(h, (WIDTH,))).chunk(3, dim=-1)
            attention = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + self.proj(attention)
            return h + self.fc2(torch.relu(self.fc1(norm(h, (WIDTH,)))))

    class TinyTransformer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, WIDTH)
            self.blocks = torch.nn.ModuleList([Block(), Block()])
            self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

        def forward(self, tokens):
            h = self.embed(tokens)
            for block in self.blocks:
                h = block(h)
            return self.head(h)

    with _SEED_LOCK:
        torch.manual_seed(1)
        return TinyTransformer()


def train_transformer(comm, world, **options):
    """One rank of :func:`make_transformer`'s training: rank r takes its share of every batch
    of sequences; returns the losses and the final params by name."""
    model = make_transformer()
    opt = Muon(model, comm, config(), lr=0.02, adam_lr=0.01, embedding_or_output=("head.weight",), **options)
    share = BATCH // world
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(2000 + step)
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        targets = (tokens * 7 + 3) % VOCAB
        mine = slice(comm.rank * share, (comm.rank + 1) * share)
        opt.zero_grad()
        logits = model(tokens[mine])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets[mine].reshape(-1))
        loss.backward()
        info = opt.step()
        assert not info.skipped, info
        losses.append(float(loss.detach()))
    params = opt.named_param_values()
    opt.close()
    return losses, params


def run_ranks(world, fn):
    results, errors = [None] * world, [None] * world
    with mo.HostGroup(world) as group:

        def body(r):
            try:
                results[r] = fn(group[r], world)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors[r] = e

        threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    for e in errors:
        if e is not None:
            raise e
    return results


def polar_f64(update, gram):
    """Five `simple` Newton–Schulz steps of ``update`` in float64, written from the published
    algorithms: the standard iteration on X, or the Gram iteration on R = X·Xᵀ with its restart
    at step 2 (Dao AI Lab's Gram Newton–Schulz; DeepSpeed's zeropower_via_gram_newtonschulz)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = update.double()
    x = x / max(float(torch.linalg.norm(x)), 1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    if not gram:
        for _ in range(5):
            s = x @ x.T
            x = a * x + (b * s + c * s @ s) @ x
        return x.T if tall else x
    eye = torch.eye(x.shape[0], dtype=torch.float64)
    r, q = x @ x.T, None
    for step in range(5):
        if step == 2:
            x, q = q @ x, None
            r = x @ x.T
        z = b * r + c * r @ r
        q = z + a * eye if q is None else a * q + z @ q
        if step not in (1, 4):
            rz = a * r + z @ r
            r = a * rz + z @ rz
    x = q @ x
    return x.T if tall else x


def gram_model():
    """A wide, a tall and a square matrix, all on Muon."""
    with _SEED_LOCK:
        torch.manual_seed(1)
        return torch.nn.Sequential(
            torch.nn.Linear(8, 24, bias=False),
            torch.nn.Tanh(),
            torch.nn.Linear(24, 8, bias=False),
            torch.nn.Tanh(),
            torch.nn.Linear(8, 8, bias=False),
        )


def one_gram_step(ns_method, variant=None, custom=None, cautious_weight_decay=None, momentum_dtype=None):
    """One step of gram_model on one rank: (initial params, grads, params after); ``custom``: a
    custom coefficient table in place of the simple set."""
    with mo.HostGroup(1) as group:
        model = gram_model()
        cfg = mo.Config(clip_grad=0.0, muon_ns_precision=mo.NsPrecision.F32, muon_coefficient_set=mo.Coefficients.SIMPLE)
        if custom is not None:
            cfg.muon_coefficient_set = mo.Coefficients.CUSTOM
            cfg.muon_custom_coefficients = custom
        opt = Muon(model, group[0], cfg, lr=0.02, weight_decay=0.1, ns_method=ns_method, variant=variant,
                   cautious_weight_decay=cautious_weight_decay, momentum_dtype=momentum_dtype)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        x = torch.linspace(-1.0, 1.0, 4 * 8).reshape(4, 8)
        model(x).square().sum().backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.synchronize()
        after = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.close()
        return before, grads, after


@unittest.skipIf(torch is None, "torch is not installed")
class TorchAdapter(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)

    def test_two_ranks_match_one_rank(self):
        (a, params_a, routes), (b, params_b, _) = run_ranks(2, train)
        ((single, params_1, routes_1),) = run_ranks(1, train)
        self.assertEqual(routes, routes_1)
        self.assertEqual(routes["embed.weight"], mo.Route.ADAMW, "the tied embedding/head stays out of Muon")
        self.assertNotIn("head.weight", routes, "a tied parameter is registered once")
        self.assertEqual(routes["fc1.weight"], mo.Route.MUON)
        self.assertEqual(routes["norm.weight"], mo.Route.ADAMW)
        for name in params_a:
            self.assertTrue(torch.equal(params_a[name], params_b[name]), f"ranks differ on {name}")
            # The 2-rank gradient is a mean of half-batch means: equal to the 1-rank one up to
            # f32 summation order, so the params agree to a tolerance, not bitwise.
            torch.testing.assert_close(params_a[name], params_1[name], rtol=1e-5, atol=5e-6, msg=name)
        initial = dict(make_model().named_parameters())
        self.assertFalse(torch.equal(params_1["fc1.weight"], initial["fc1.weight"]), "training changed the params")
        self.assertLess(single[-1], single[0], "the loss falls")
        # Lazy comm: params arrive only when a forward pre-hook waits for them, so a hook
        # missing on some module would leave it training on stale params.
        lazy = run_ranks(2, lambda comm, world: train(comm, world, mo.CommMode.LAZY))
        for name in params_a:
            self.assertTrue(torch.equal(lazy[0][1][name], params_a[name]), f"lazy != eager on {name}")

    def test_lr_scheduler_drives_lr_and_checkpoint_round_trip(self):
        with mo.HostGroup(1) as group, tempfile.TemporaryDirectory() as tmp:
            model = make_model()
            opt = Muon(model, group[0], config(), lr=0.02, adam_lr=0.01)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            tokens, targets = batch(0)
            for _ in range(2):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(tokens), targets).backward()
                opt.step()
                sched.step()
            self.assertAlmostEqual(opt.param_groups[0]["lr"], 0.005)
            self.assertEqual(opt.state_dict()["muon_opt"]["model"]["step"], 2)
            opt.save(Path(tmp) / "ckpt")
            opt.synchronize()
            saved = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(tokens), targets).backward()
            opt.step()
            opt.synchronize()
            self.assertFalse(torch.equal(model.fc1.weight, saved["fc1.weight"]))
            opt.load(Path(tmp) / "ckpt")
            opt.synchronize()
            for n, p in model.named_parameters():
                self.assertTrue(torch.equal(p, saved[n]), n)
            opt.close()

    def test_contiguous_ownership_trains_like_balanced_bitwise(self):
        """``ownership="contiguous"`` moves each Muon matrix to one owner per bucket: the same
        update on every rank as balanced ownership, bit for bit."""
        balanced = run_ranks(2, lambda comm, world: train(comm, world, ownership="balanced"))
        contiguous = run_ranks(2, lambda comm, world: train(comm, world, ownership="contiguous"))
        for (losses_b, params_b, _), (losses_c, params_c, _) in zip(balanced, contiguous):
            self.assertEqual(losses_b, losses_c)
            for name in params_b:
                self.assertTrue(torch.equal(params_b[name], params_c[name]), name)

        def planned(comm, world, ownership):
            opt = Muon(make_model(), comm, config(mo.CommMode.EAGER), ownership=ownership)
            method = opt._opt.plan()["report"]["ownership"]
            opt.close()
            return method

        for ownership, method in (("balanced", "lpt_stack_fill"), ("contiguous", "contiguous"),
                                  ("auto", "lpt_stack_fill")):
            self.assertEqual(run_ranks(2, lambda comm, world: planned(comm, world, ownership)), [method] * 2)

    def test_network_keywords_reach_the_plan(self):
        """``network=(latency, bandwidth)`` declares the ring the planner prices its choices on."""

        def planned(comm, world, network):
            opt = Muon(make_model(), comm, config(mo.CommMode.EAGER), network=network, expert_network=(3.4, 360.0))
            report = opt._opt.plan()["report"]
            opt.close()
            return report["choice"]["network"]

        got = run_ranks(2, lambda comm, world: planned(comm, world, (14.0, 45.0)))
        self.assertEqual(got, [{"hop_latency_us": 14.0, "bus_bandwidth_gbps": 45.0}] * 2)
        with self.assertRaises(mo.MuonError) as ctx:
            run_ranks(1, lambda comm, world: planned(comm, world, (14.0, 0.0)))
        self.assertIn("network.bus_bandwidth_gbps", str(ctx.exception))

    def test_gram_ns_method(self):
        """``ns_method="gram"``: the wide (24 × 8 weight: 8 × 24 iterate) and tall matrices take
        the Gram iteration — another rounding of the standard update, within f32 rounding of a
        float64 Gram iteration written here — and the square one the standard iteration, bit
        for bit."""
        before, grads, standard = one_gram_step("standard")
        _, grads_gram, gram = one_gram_step("gram")
        for name in before:
            self.assertTrue(torch.equal(grads[name], grads_gram[name]), name)
            square = name == "4.weight"
            self.assertEqual(torch.equal(gram[name], standard[name]), square, name)
            # W = W·(1 − lr·wd) − lr·√max(m, n)·NS((1 − μ)·g), zero momentum before the step.
            rows, cols = before[name].shape
            want = before[name].double() * (1 - 0.02 * 0.1) - 0.02 * max(rows, cols) ** 0.5 * polar_f64(
                (1 - 0.95) * grads[name].double(), gram=not square
            )
            # The updates are ~0.03; f32 rounding leaves them ~1e-6 off the float64 ones.
            for got in (gram[name], standard[name]):
                torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5, msg=name)
            moved = float((standard[name] - before[name]).abs().max())
            self.assertLess(float((gram[name] - standard[name]).abs().max()), 1e-3 * moved, name)

    def test_normuon_variant(self):
        """``variant="normuon"``: from zero state the second moment is (1 − β2) times the mean
        square of each line of the longer side of the orthogonalized update X (read off the
        standard step), X divided by its root and brought back to X's norm, then scaled as
        Muon's (Emerging-Optimizers' AdaptiveMuon, written here in float64)."""
        before, grads, standard = one_gram_step("standard")
        _, _, normuon = one_gram_step("standard", variant="normuon")
        lr, wd, beta2 = 0.02, 0.1, 0.95
        for name in before:
            rows, cols = before[name].shape
            scale = lr * max(rows, cols) ** 0.5
            decayed = before[name].double() * (1 - lr * wd)
            x = (decayed - standard[name].double()) / scale
            v = (1 - beta2) * x.square().mean(dim=1 if rows >= cols else 0, keepdim=True)
            y = x / v.clamp_min(1e-8).sqrt()
            y = y * (x.norm() / y.norm())
            want = decayed - scale * y
            torch.testing.assert_close(normuon[name].double(), want, rtol=0, atol=1e-5, msg=name)
            self.assertGreater(float((normuon[name] - standard[name]).abs().max()), 1e-4, name)
        with self.assertRaises(ValueError):
            one_gram_step("standard", variant="namo")

    def test_adamuon_variant(self):
        """``variant="adamuon"``: from zero state the second moment is (1 − β2) times the square
        of each element of the orthogonalized update X (read off the standard step), X divided
        by its root plus ε element by element, then scaled as Muon's (Emerging-Optimizers'
        AdaptiveMuon, written here in float64)."""
        before, grads, standard = one_gram_step("standard")
        _, _, adamuon = one_gram_step("standard", variant="adamuon")
        lr, wd, beta2, eps = 0.02, 0.1, 0.95, 1e-8
        for name in before:
            rows, cols = before[name].shape
            scale = lr * max(rows, cols) ** 0.5
            decayed = before[name].double() * (1 - lr * wd)
            x = (decayed - standard[name].double()) / scale
            y = x / (((1 - beta2) * x.square()).sqrt() + eps)
            want = decayed - scale * y
            torch.testing.assert_close(adamuon[name].double(), want, rtol=0, atol=1e-5, msg=name)
            self.assertGreater(float((adamuon[name] - standard[name]).abs().max()), 1e-2, name)

    def test_cautious_weight_decay_keyword(self):
        """``cautious_weight_decay=True`` (microsoft/dion's ``cautious_wd``): the weight is decayed
        only where it and its update s·X (read off the plain step) share a sign; elsewhere it
        keeps its value before the update."""
        before, _, plain = one_gram_step("standard")
        _, _, cautious = one_gram_step("standard", cautious_weight_decay=True)
        lr, wd = 0.02, 0.1
        for name in before:
            w = before[name].double()
            decayed = w * (1 - lr * wd)
            step_x = decayed - plain[name].double()
            agree = w * step_x >= 0
            want = torch.where(agree, decayed, w) - step_x
            torch.testing.assert_close(cautious[name].double(), want, rtol=0, atol=1e-6, msg=name)
            self.assertTrue(bool(agree.any()) and not bool(agree.all()), name)

    def test_momentum_dtype_keyword(self):
        """``momentum_dtype=torch.bfloat16`` stores the Muon momentum in bf16: from zero state the
        first momentum is (1 − μ)·g rounded to bf16 (read back through ``state_dict``, as
        float32), and the step differs from the f32 one; any other dtype is a ValueError."""
        with mo.HostGroup(1) as group:
            model = gram_model()
            cfg = mo.Config(clip_grad=0.0, muon_ns_precision=mo.NsPrecision.F32)
            opt = Muon(model, group[0], cfg, lr=0.02, weight_decay=0.1, momentum_dtype=torch.bfloat16)
            opt.zero_grad()
            x = torch.linspace(-1.0, 1.0, 4 * 8).reshape(4, 8)
            model(x).square().sum().backward()
            grads = [p.grad.detach().clone() for p in model.parameters()]
            opt.step()
            state = opt.state_dict()["state"]
            opt.close()
        one_minus_mu = torch.tensor(1.0, dtype=torch.float32) - torch.tensor(0.95, dtype=torch.float32)
        for k, g in enumerate(grads):
            want = (one_minus_mu * g).to(torch.bfloat16).to(torch.float32)
            self.assertTrue(torch.equal(state[k]["momentum"], want), k)
        before, _, f32_after = one_gram_step("standard")
        _, _, bf16_after = one_gram_step("standard", momentum_dtype=torch.bfloat16)
        for name in before:
            self.assertFalse(torch.equal(f32_after[name], bf16_after[name]), name)
        with self.assertRaises(ValueError):
            one_gram_step("standard", momentum_dtype=torch.float16)

    def test_param_sharding_keywords_reach_the_config(self):
        """``param_sharding="sharded"`` with its policy reaches the library's config (its plan
        hash differs from replicated's), and a name that is no mode is a ValueError."""
        with mo.HostGroup(1) as group:
            opt = Muon(gram_model(), group[0], param_sharding="sharded", reshard_after_forward=False, param_prefetch_buckets=2)
            self.assertEqual(opt.config.param_sharding, mo.ParamSharding.SHARDED)
            self.assertEqual((opt.config.reshard_after_forward, opt.config.param_prefetch_buckets), (0, 2))
            sharded_hash = opt._opt.plan()["hash"]
            opt.close()
            with self.assertRaises(ValueError):
                Muon(gram_model(), group[0], param_sharding="zero3")
        with mo.HostGroup(1) as group:  # the closed optimizer's views keep its claim on the first
            opt = Muon(gram_model(), group[0], param_sharding="replicated", param_prefetch_buckets=4)
            self.assertNotEqual(opt._opt.plan()["hash"], sharded_hash)
            opt.close()

    def test_a_small_transformer_trains_sharded_with_the_losses_of_replicated(self):
        """A two-block transformer at two ranks with sharded params — FSDP2's hooks: gather
        before each module's forward and backward, release after, prefetch one bucket — gives
        the losses and params of replicated params bit for bit, with and without
        ``reshard_after_forward``; a param read outside its gathered bucket is refused."""
        replicated = run_ranks(2, lambda comm, world: train_transformer(comm, world))
        for reshard in (True, False):
            sharded = run_ranks(
                2,
                lambda comm, world: train_transformer(
                    comm, world, param_sharding="sharded", reshard_after_forward=reshard, param_prefetch_buckets=1
                ),
            )
            for (losses_r, params_r), (losses_s, params_s) in zip(replicated, sharded):
                self.assertEqual(losses_s, losses_r, f"reshard_after_forward={reshard}")
                self.assertLess(losses_s[-1], losses_s[0], "the loss falls")
                for name in params_r:
                    self.assertTrue(torch.equal(params_s[name], params_r[name]), f"{name} reshard={reshard}")
        with mo.HostGroup(1) as group:
            opt = Muon(make_transformer(), group[0], config(), param_sharding="sharded", embedding_or_output=("head.weight",))
            with self.assertRaises(mo.MuonError) as caught:
                opt._opt.param_view(0)
            self.assertEqual(caught.exception.status, mo.Status.INVALID_STATE)
            self.assertIn("'embed.weight' is in bucket", str(caught.exception))
            with self.assertRaises(RuntimeError):
                with opt.no_sync():
                    pass
            opt.close()

    def test_a_custom_coefficient_table_reaches_the_optimizer(self):
        """A config's custom table goes through the adapter (whose ``ns_method`` keyword
        copies the config): one triple, the simple one, steps bit for bit as the simple set;
        another table steps otherwise."""
        _, _, simple = one_gram_step("standard")
        _, _, custom = one_gram_step("standard", custom=[(3.4445, -4.7750, 2.0315)])
        _, _, other = one_gram_step("standard", custom=[(3.0, -3.2, 1.2)])
        for name in simple:
            self.assertTrue(torch.equal(custom[name], simple[name]), name)
            self.assertFalse(torch.equal(other[name], simple[name]), name)

    def test_an_untied_output_head_must_be_named(self):
        class Untied(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(VOCAB, WIDTH)
                self.fc = torch.nn.Linear(WIDTH, WIDTH, bias=False)
                self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

        with mo.HostGroup(1) as group:
            with self.assertRaises(mo.MuonError) as ctx:
                Muon(Untied(), group[0])
            self.assertIn("head.weight", str(ctx.exception))
            opt = Muon(Untied(), group[0], embedding_or_output=["head.weight"])
            opt.close()

    def test_refusals(self):
        with mo.HostGroup(1) as group:
            with self.assertRaises(ValueError) as ctx:
                Muon(make_model(), group[0], ns_method="fast")
            self.assertIn("ns_method", str(ctx.exception))
            with self.assertRaises(ValueError) as ctx:
                Muon(make_model(), group[0], ownership="wrapped")
            self.assertIn("ownership: expected one of ['auto', 'balanced', 'contiguous']", str(ctx.exception))
            with self.assertRaises(ValueError) as ctx:
                Muon(make_model(), group[0], mo.Config(grad_dtype=mo.Dtype.BF16))
            self.assertIn("grad_dtype", str(ctx.exception))
            with self.assertRaises(ValueError) as ctx:
                Muon(make_model(), group[0], embedding_or_output=["lm_head.weight"])
            self.assertIn("lm_head.weight", str(ctx.exception))
            with self.assertRaises(TypeError):
                Muon(make_model().double(), group[0])
        with mo.HostGroup(1) as group:
            # ns_method overrides the config's method, on a copy.
            cfg = mo.Config(muon_ns_method=mo.NsMethod.GRAM)
            opt = Muon(make_model(), group[0], cfg, ns_method="standard")
            self.assertEqual(opt.config.muon_ns_method, mo.NsMethod.STANDARD)
            self.assertEqual(cfg.muon_ns_method, mo.NsMethod.GRAM)
            opt.close()


if __name__ == "__main__":
    unittest.main()
