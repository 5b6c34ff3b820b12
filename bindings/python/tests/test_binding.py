"""The object API over the real library: a 2-rank host run on Python threads, errors, views."""

import array
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PACKAGE_ROOT))

import muon_opt as mo  # noqa: E402
from muon_opt import _capi  # noqa: E402

VOCAB = 24
MODEL = [  # name, shape, flags, tie_group — forward order
    ("embedding.weight", (VOCAB, 8), mo.ParamFlag.EMBEDDING_OR_OUTPUT, 1),
    ("fc1.weight", (16, 8), 0, 0),
    ("fc1.bias", (16,), mo.ParamFlag.NO_WEIGHT_DECAY, 0),
    ("fc2.weight", (8, 16), 0, 0),
    ("output.weight", (VOCAB, 8), mo.ParamFlag.EMBEDDING_OR_OUTPUT, 1),
]
STEPS = 4


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def rank_grad(step, rank, p, i):
    """A gradient value k/1024 with |k| <= 32: sums and halves of two are exact in f32, so the
    2-rank mean equals the 1-rank input bit for bit whatever the reduction order."""
    h = (step * 1_000_003 + rank * 7_919 + p * 104_729 + i * 31) * 0x9E3779B1 & 0xFFFFFFFF
    return ((h >> 7) % 65 - 32) / 1024.0


def initial(name, shape):
    """Initial values; the tied output head starts equal to the embedding."""
    p = 0 if name == "output.weight" else [m[0] for m in MODEL].index(name)
    return array.array("f", [((p * 131 + i * 17) % 97 - 48) / 512.0 for i in range(numel(shape))])


def config(**overrides):
    fields = dict(
        bucket_size=256,  # several buckets for this small model
        clip_grad=0.0,
        muon_ns_precision=mo.NsPrecision.F32,
        vocab_size=VOCAB,
        collective_timeout_ms=20000,  # a failing rank fails the other quickly
    )
    fields.update(overrides)
    return mo.Config(**fields)


def train(comm, grads_for, cfg):
    """One rank: registers MODEL, runs STEPS iterations with grads_for(step, p, i), returns the
    param bytes after every step."""
    with mo.Optimizer(cfg, comm) as opt:
        for p, (name, shape, flags, tie) in enumerate(MODEL):
            pid = opt.add_param(name, shape, dtype=mo.Dtype.F32, flags=flags, tie_group=tie, init=initial(name, shape))
            assert pid == p
        opt.finalize()
        views = [opt.param_view(p) for p in range(len(MODEL))]
        history = []
        for step in range(STEPS):
            opt.zero_grad()
            for v in views:  # forward: pre-hook before each param's use
                opt.wait_params(v.bucket)
            for p in reversed(range(len(MODEL))):  # backward: reverse order
                v = views[p]
                v.grad[:] = array.array("f", [grads_for(step, p, i) for i in range(v.numel)])
                opt.grad_ready(p)
            info = opt.step(lr=0.02, adam_lr=0.01, weight_decay=0.1, adam_weight_decay=0.01)
            assert not info.skipped and info.step == step + 1, info
            for v in views:
                opt.wait_params(v.bucket)
            history.append(b"".join(v.data.tobytes() for v in views))
        return history


def run_ranks(world_size, fn):
    """fn(comm) on one Python thread per rank; returns the results in rank order, re-raising
    the first exception of any rank."""
    results, errors = [None] * world_size, [None] * world_size
    with mo.HostGroup(world_size) as group:

        def body(r):
            try:
                results[r] = fn(group[r])
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors[r] = e

        threads = [threading.Thread(target=body, args=(r,)) for r in range(world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
            if t.is_alive():
                raise TimeoutError("a rank did not finish")
    for e in errors:
        if e is not None:
            raise e
    return results


class TwoRanksOnThreads(unittest.TestCase):
    def test_two_ranks_equal_one_rank_fed_the_mean_gradient(self):
        def own_grads(comm, mode):
            return train(comm, lambda s, p, i: rank_grad(s, comm.rank, p, i), config(host_comm_mode=mode))

        def mean_grads(comm, mode):
            return train(
                comm, lambda s, p, i: (rank_grad(s, 0, p, i) + rank_grad(s, 1, p, i)) / 2, config(host_comm_mode=mode)
            )

        for mode in (mo.CommMode.EAGER, mo.CommMode.LAZY):  # lazy: a missing wait shows as stale data
            with self.subTest(host_comm_mode=mode.name):
                ranks = run_ranks(2, lambda comm, mode=mode: own_grads(comm, mode))
                (single,) = run_ranks(1, lambda comm, mode=mode: mean_grads(comm, mode))
                self.assertNotEqual(single[0], single[-1], "training must change the params")
                for step in range(STEPS):
                    self.assertEqual(ranks[0][step], ranks[1][step], f"ranks differ after step {step + 1}")
                    self.assertEqual(ranks[0][step], single[step], f"2 ranks != 1 rank after step {step + 1}")

    def test_contiguous_ownership_trains_like_balanced_bitwise(self):
        def run(ownership):
            cfg = config(muon_ownership=ownership)
            return run_ranks(2, lambda comm: (train(comm, lambda s, p, i: rank_grad(s, comm.rank, p, i), cfg)))

        def owners(comm):
            with mo.Optimizer(config(muon_ownership=mo.Ownership.CONTIGUOUS), comm) as opt:
                for name, shape, flags, tie in MODEL:
                    opt.add_param(name, shape, dtype=mo.Dtype.F32, flags=flags, tie_group=tie)
                opt.finalize()
                return [opt.param_view(p).owner for p in (1, 3)], opt.plan()["report"]["ownership"]

        balanced, contiguous = run(mo.Ownership.BALANCED), run(mo.Ownership.CONTIGUOUS)
        self.assertEqual(balanced, contiguous)
        # Backward order: the last Muon matrix is the first rank's run.
        self.assertEqual(run_ranks(2, owners)[0], ([1, 0], "contiguous"))
        with self.assertRaises(mo.MuonError) as ctx:
            config(muon_ownership=mo.Ownership.CONTIGUOUS, muon_layout=mo.Layout.PADDED).validate()
        self.assertEqual(ctx.exception.status, mo.Status.INCOMPATIBLE_OPTIONS)
        self.assertIn("muon_ownership: contiguous needs a compact", str(ctx.exception))

    def test_a_declared_network_plans_by_cost_agrees_across_ranks_and_is_checked(self):
        cfg = config()
        self.assertEqual((cfg.muon_ownership, cfg.network, cfg.expert_network), (mo.Ownership.AUTO, None, None))
        cfg.network = (14.0, 45.0)
        self.assertEqual(cfg.network, mo.Network(14.0, 45.0))
        self.assertEqual(mo.Config(**cfg.as_dict()).network, mo.Network(14.0, 45.0))

        def choice(comm, network):
            with mo.Optimizer(config(network=network), comm) as opt:
                for name, shape, flags, tie in MODEL:
                    opt.add_param(name, shape, dtype=mo.Dtype.F32, flags=flags, tie_group=tie)
                opt.finalize()
                return opt.plan()["report"]["choice"]

        declared = run_ranks(2, lambda comm: choice(comm, mo.Network(14.0, 45.0)))
        self.assertEqual(declared[0], declared[1])
        self.assertEqual(declared[0]["network"], {"hop_latency_us": 14.0, "bus_bandwidth_gbps": 45.0})
        self.assertTrue(all(a["modelled_exposed_ms"] is not None for a in declared[0]["alternatives"]))
        undeclared = run_ranks(1, lambda comm: choice(comm, None))[0]
        self.assertIsNone(undeclared["network"])
        self.assertTrue(all(a["modelled_exposed_ms"] is None for a in undeclared["alternatives"]))

        def mismatched(comm):
            network = (14.0, 45.0) if comm.rank == 0 else (14.0, 50.0)
            with mo.Optimizer(config(network=network), comm) as opt:
                for name, shape, flags, tie in MODEL:
                    opt.add_param(name, shape, dtype=mo.Dtype.F32, flags=flags, tie_group=tie)
                with self.assertRaises(mo.MuonError) as ctx:
                    opt.finalize()
                return ctx.exception.status, str(ctx.exception)

        for status, message in run_ranks(2, mismatched):
            self.assertIs(status, mo.Status.PLAN_MISMATCH)
            self.assertIn("config field 'network'", message)
        for network, needle in (((-1.0, 45.0), "network.hop_latency_us"), ((14.0, 0.0), "network.bus_bandwidth_gbps"),
                                ((float("nan"), 45.0), "network.hop_latency_us")):
            with self.assertRaises(mo.MuonError) as ctx:
                config(network=network).validate()
            self.assertIs(ctx.exception.status, mo.Status.OUT_OF_RANGE)
            self.assertIn(needle, str(ctx.exception))
        with self.assertRaises(mo.MuonError) as ctx:
            config(expert_network=(1.0, -2.0)).validate()
        self.assertIn("expert_network.bus_bandwidth_gbps", str(ctx.exception))
        with self.assertRaises(TypeError):
            config(network=45.0)

    def test_routes_owners_and_plan(self):
        def body(comm):
            with mo.Optimizer(config(), comm) as opt:
                for name, shape, flags, tie in MODEL:
                    opt.add_param(name, shape, dtype=mo.Dtype.F32, flags=flags, tie_group=tie)
                opt.finalize()
                views = [opt.param_view(p) for p in range(len(MODEL))]
                self.assertEqual(views[1].data.format, "f")
                self.assertEqual(len(views[1].data), 128)
                return [opt.param_route(p) for p in range(len(MODEL))], views, opt.plan()

        (routes, views, plan), (routes1, views1, _) = run_ranks(2, body)
        self.assertEqual(routes, [mo.Route.ADAMW, mo.Route.MUON, mo.Route.ADAMW, mo.Route.MUON, mo.Route.ADAMW])
        self.assertEqual(routes, routes1)
        self.assertEqual({views[1].owner, views[3].owner}, {0, 1}, "the two Muon matrices are balanced over 2 ranks")
        self.assertEqual([v.owner for v in views], [v.owner for v in views1])
        self.assertEqual(views[0].owner, -1)
        self.assertEqual(plan["dp"], 2)
        self.assertEqual(views[1].shape, (16, 8))
        # The ranks' optimizers are closed; their views still read the last params.
        self.assertEqual(len(views[1].data.tolist()), 128)


class Errors(unittest.TestCase):
    def test_status_and_message_of_a_failing_call(self):
        with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
            opt.add_param("embedding", (VOCAB, 8), flags=mo.ParamFlag.EMBEDDING_OR_OUTPUT, tie_group=3)
            with self.assertRaises(mo.MuonError) as ctx:
                opt.add_param("mtp.embedding", (VOCAB, 8), tie_group=3, flags=mo.ParamFlag.ALLOW_VOCAB_DIM)
            e = ctx.exception
            self.assertIs(e.status, mo.Status.ROUTING_CONFLICT)
            self.assertEqual(e.status, mo.MUON_STATUS_ROUTING_CONFLICT)
            self.assertEqual(e.function, "muon_optimizer_add_param")
            self.assertIn("tie_group 3", e.message)
            self.assertIn("mtp.embedding", e.message)
            self.assertIn("'embedding'", e.message)
            self.assertIn("MUON_STATUS_ROUTING_CONFLICT (111)", str(e))
            # Nothing was registered: the next id is 1.
            self.assertEqual(opt.add_param("fc", (16, 8)), 1)

    def test_config_errors(self):
        with self.assertRaises(mo.MuonError) as ctx:
            mo.Config(muon_layout=7).validate()
        self.assertIs(ctx.exception.status, mo.Status.INVALID_ENUM_VALUE)
        self.assertIn("muon_layout", ctx.exception.message)
        with mo.HostGroup(1) as group, self.assertRaises(mo.MuonError) as ctx:
            mo.Optimizer(mo.Config(adam_beta1=1.5), group[0])
        self.assertIn("adam_beta1", ctx.exception.message)
        with self.assertRaises(AttributeError):
            mo.Config(bucket_sise=10)  # typo: not a field
        self.assertAlmostEqual(mo.Config().muon_momentum, 0.95, places=6)
        self.assertEqual(mo.Config().muon_ns_method, mo.NsMethod.STANDARD)
        with self.assertRaises(mo.MuonError) as ctx:
            mo.Config(muon_ns_method=5).validate()
        self.assertIs(ctx.exception.status, mo.Status.INVALID_ENUM_VALUE)
        self.assertIn("muon_ns_method", ctx.exception.message)

    def test_call_order_and_closed_handles(self):
        with mo.HostGroup(1) as group:
            opt = mo.Optimizer(config(), group[0])
            with self.assertRaises(mo.MuonError) as ctx:
                opt.wait_params(0)  # before finalize
            self.assertIs(ctx.exception.status, mo.Status.INVALID_STATE)
            opt.add_param("w", (16, 8))
            opt.finalize()
            with self.assertRaises(mo.MuonError) as ctx:
                opt.param_view(5)
            self.assertIn("5", ctx.exception.message)
            opt.close()
            opt.close()  # idempotent
            with self.assertRaises(mo.MuonError) as ctx:
                opt.zero_grad()  # NULL handle: the library's NULL_ARGUMENT
            self.assertIs(ctx.exception.status, mo.Status.NULL_ARGUMENT)

    def test_messages_are_per_thread(self):
        with self.assertRaises(mo.MuonError):
            mo.Config(muon_layout=7).validate()
        self.assertIn(b"muon_layout", _capi.lib().muon_last_error_message())
        seen = []
        t = threading.Thread(target=lambda: seen.append(_capi.lib().muon_last_error_message()))
        t.start()
        t.join()
        self.assertEqual(seen, [b""])

    def test_binding_level_checks(self):
        with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
            with self.assertRaises(ValueError):
                opt.add_param("w", (16, 8), init=array.array("f", [0.0] * 10))  # wrong size
            with self.assertRaises(ValueError):
                opt.add_param("w", (2,), init=array.array("d", [0.0] * 2))  # f64: no such dtype
            with self.assertRaises(mo.MuonError) as ctx:
                opt.add_param("w", (1, 2, 3, 4, 5))  # the library rejects ndim 5
            self.assertIs(ctx.exception.status, mo.Status.INVALID_PARAM)

    def test_status_strings(self):
        self.assertEqual(mo.status_string(0), _capi.lib().muon_status_string(0).decode())
        self.assertIn("unknown", mo.status_string(12345))
        e = _capi.MuonError(12345, "x")
        self.assertEqual(e.status, 12345)


class Library(unittest.TestCase):
    def test_version_matches_mirror(self):
        self.assertEqual(mo.version(), mo.MUON_VERSION_CODE)

    def test_env_var_selects_the_library(self):
        code = "import muon_opt as mo; print(mo.version()); print(mo.lib().path)"
        lib = _capi.lib().path
        env = dict(os.environ, MUON_OPT_LIB=str(Path(lib).parent), PYTHONPATH=str(PACKAGE_ROOT))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.split(), [str(mo.MUON_VERSION_CODE), lib])
        env["MUON_OPT_LIB"] = "/nonexistent/libmuon_opt.so"
        bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("ImportError", bad.stderr)
        self.assertIn("/nonexistent/libmuon_opt.so", bad.stderr)
        self.assertIn("MUON_OPT_LIB", bad.stderr)

    def test_newton_schulz_host(self):
        rows, cols = 8, 24
        data = array.array("f", [((i * 37) % 23 - 11) / 11.0 for i in range(rows * cols)])
        out = mo.newton_schulz_host(data, rows, cols, coefficient_set=mo.Coefficients.SIMPLE)
        self.assertEqual(len(out), rows * cols)
        diag = sum(sum(out[r * cols + c] ** 2 for c in range(cols)) for r in range(rows)) / rows
        self.assertAlmostEqual(diag, 0.85, delta=0.2)  # rows of an orthogonalized matrix: near unit norm

    def test_custom_coefficients(self):
        """A custom table of the five quintic triples cycles as quintic_cyclic does, bit for
        bit; the table reads back as set; a bad table names its field."""
        rows, cols = 8, 24
        data = array.array("f", [((i * 37) % 23 - 11) / 11.0 for i in range(rows * cols)])
        quintic = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                   (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]
        cyclic = mo.newton_schulz_host(data, rows, cols, coefficient_set=mo.Coefficients.QUINTIC_CYCLIC, steps=7)
        custom = mo.newton_schulz_host(data, rows, cols, coefficient_set=mo.Coefficients.CUSTOM, steps=7,
                                       custom_coefficients=quintic)
        self.assertEqual(cyclic.tobytes(), custom.tobytes())
        self.assertNotEqual(cyclic.tobytes(), mo.newton_schulz_host(data, rows, cols, steps=7).tobytes())
        config = mo.Config(muon_coefficient_set=mo.Coefficients.CUSTOM, muon_custom_coefficients=quintic[:2])
        self.assertEqual(config.muon_custom_coefficient_steps, 2)
        self.assertEqual(len(config.muon_custom_coefficients), 2)
        config.validate()
        config.muon_custom_coefficients = [(1.0, float("inf"), 0.0)]
        with self.assertRaises(mo.MuonError) as ctx:
            config.validate()
        self.assertIn("muon_custom_coefficients[0].b", ctx.exception.message)
        with self.assertRaises(mo.MuonError) as ctx:
            mo.Config(muon_coefficient_set=mo.Coefficients.CUBIC5, muon_num_ns_steps=4).validate()
        self.assertIs(ctx.exception.status, mo.Status.INCOMPATIBLE_OPTIONS)
        with self.assertRaises(TypeError):
            mo.Config(muon_custom_coefficients=[(1.0, 2.0)])

    def test_newton_schulz_host_gram(self):
        """8 × 24 (n/m = 3): the Gram iteration applies; another rounding of the same result.
        8 × 10 (n/m = 1.25): it does not, and the standard iteration runs bit for bit."""
        for rows, cols, applies in ((8, 24, True), (8, 10, False)):
            data = array.array("f", [((i * 37) % 23 - 11) / 11.0 for i in range(rows * cols)])
            standard = mo.newton_schulz_host(data, rows, cols)
            gram = mo.newton_schulz_host(data, rows, cols, method=mo.NsMethod.GRAM)
            self.assertEqual(standard != gram, applies, (rows, cols))
            self.assertLess(max(abs(a - b) for a, b in zip(standard, gram)), 1e-4)
        with self.assertRaises(mo.MuonError) as ctx:
            mo.newton_schulz_host(data, rows, cols, method=2)
        self.assertIs(ctx.exception.status, mo.Status.INVALID_ENUM_VALUE)
        self.assertIn("muon_ns_method: unknown value 2", ctx.exception.message)

    def test_a_live_view_of_a_closed_optimizer_keeps_the_comm_and_says_so(self):
        with mo.HostGroup(1) as group:
            opt = mo.Optimizer(config(), group[0])
            opt.add_param("w", (16, 8))
            opt.finalize()
            data = opt.param_view(0).data
            opt.close()
            with self.assertRaises(mo.MuonError) as ctx:
                mo.Optimizer(config(), group[0])
            self.assertIs(ctx.exception.status, mo.Status.INVALID_STATE)
            self.assertIn("already used by another optimizer", ctx.exception.message)
            self.assertIn("param view of it", ctx.exception.message)
            self.assertEqual(len(data), 128)  # the memory is still readable
            del data
            mo.Optimizer(config(), group[0]).close()  # the last view gone, the comm is free

    def test_mxfp8_views(self):
        with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
            pid = opt.add_param("w", (64, 32), flags=mo.ParamFlag.MXFP8)
            opt.finalize()
            v = opt.param_view(pid)
            self.assertIsNone(v.data)
            self.assertEqual((v.mxfp8_rows, v.mxfp8_cols), (64, 32))
            self.assertEqual(len(v.mxfp8_rowwise_data), 64 * 32)
            rr, rc, cr, cc = mo.mxfp8_scale_shape(64, 32)
            self.assertEqual(len(v.mxfp8_rowwise_scales), rr * rc)
            self.assertEqual(len(v.mxfp8_colwise_scales), cr * cc)
            self.assertEqual(v.grad.format, "f")

    def test_step_without_waiting_then_step_info(self):
        with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
            w = opt.add_param("w", (16, 8), dtype=mo.Dtype.F32)
            opt.finalize()
            self.assertEqual(opt.step_info().step, 0)
            opt.zero_grad()
            opt.grad_ready(w)
            self.assertIsNone(opt.step(lr=0.02, adam_lr=1e-3, wait=False))
            info = opt.step_info()
            self.assertEqual((info.step, info.skipped), (1, False))

    def test_split_groups_reach_the_library(self):
        with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
            with self.assertRaises(mo.MuonError) as ctx:
                opt.add_param("qkv", (48, 32), split_sizes=(8, 4, 4), split_groups=2)
            self.assertIs(ctx.exception.status, mo.Status.INVALID_PARAM)
            self.assertIn("2 groups sum to 32", str(ctx.exception))
            pid = opt.add_param("qkv", (48, 32), split_sizes=(8, 4, 4), split_groups=3)
            self.assertEqual(opt.param_route(pid), mo.Route.MUON)

    def test_step_shared_clips_two_optimizers_with_one_norm(self):
        with mo.HostGroup(1) as ga, mo.HostGroup(1) as gb:
            with mo.Optimizer(config(clip_grad=1.0), ga[0]) as a, mo.Optimizer(config(clip_grad=1.0), gb[0]) as b:
                for opt, shape, value in [(a, (64, 32), 1.0), (b, (16, 8), 2.0)]:
                    w = opt.add_param("w", shape, dtype=mo.Dtype.F32)
                    opt.finalize()
                    opt.zero_grad()
                    view = opt.param_view(w)
                    view.grad[:] = array.array("f", [value] * view.numel)
                    opt.grad_ready(w)
                with self.assertRaises(ValueError):
                    mo.step_shared([a, b], [dict(lr=0.02, adam_lr=1e-3)])
                with self.assertRaises(mo.MuonError) as ctx:
                    mo.step_shared([a, a])
                self.assertIs(ctx.exception.status, mo.Status.INVALID_ARGUMENT)
                mo.step_shared([a, b], [dict(lr=0.02, adam_lr=1e-3), dict(lr=0.01, adam_lr=1e-3)])
                infos = [a.step_info(), b.step_info()]
                self.assertEqual(infos[0], infos[1])
                self.assertEqual(infos[0].grad_norm, (2048.0 + 512.0) ** 0.5)
                self.assertEqual(infos[0].step, 1)

    def test_duplicated_tp_shards_train_like_the_whole_matrix(self):
        rows, cols = 16, 12
        init = [((i * 29) % 17 - 8) / 40.0 for i in range(rows * cols)]
        grad = [((i * 13) % 23 - 11) / 10.0 for i in range(rows * cols)]
        cfg = dict(muon_tp_mode=mo.TpMode.DUPLICATED, clip_grad=0.0)

        def train(opt, pid, lo, hi):
            opt.finalize()
            opt.zero_grad()
            view = opt.param_view(pid)
            view.grad[:] = array.array("f", grad[lo:hi])
            opt.grad_ready(pid)
            opt.step(lr=0.02, adam_lr=1e-3)
            opt.wait_params(view.bucket)
            return view.data.tobytes()

        def shard(tp_comm):
            half = rows * cols // 2
            lo = tp_comm.rank * half
            with mo.HostGroup(1) as dp, mo.Optimizer(config(**cfg), dp[0]) as opt:
                opt.set_tp_group(tp_comm)
                values = array.array("f", init[lo : lo + half])
                pid = opt.add_param("fc1", (rows // 2, cols), dtype=mo.Dtype.F32, flags=mo.ParamFlag.TP_SHARD_ROWS, init=values)
                return train(opt, pid, lo, lo + half)

        shards = run_ranks(2, shard)
        with mo.HostGroup(1) as dp, mo.Optimizer(config(**cfg), dp[0]) as opt:
            pid = opt.add_param("fc1", (rows, cols), dtype=mo.Dtype.F32, init=array.array("f", init))
            whole = train(opt, pid, 0, rows * cols)
        self.assertEqual(shards[0] + shards[1], whole)
        with mo.HostGroup(1) as dp, mo.Optimizer(config(**cfg), dp[0]) as opt:
            opt.add_param("fc1", (rows // 2, cols), dtype=mo.Dtype.F32, flags=mo.ParamFlag.TP_SHARD_ROWS)
            with self.assertRaises(mo.MuonError) as ctx:
                opt.finalize()
            self.assertIs(ctx.exception.status, mo.Status.INVALID_STATE)
            self.assertIn("muon_optimizer_set_tp_group", str(ctx.exception))

    def test_steps_with_set_arguments_and_joins_match_steps_with_arguments_bitwise(self):
        def run(preset):
            with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
                views = register(opt)
                if preset:
                    with self.assertRaises(mo.MuonError) as ctx:
                        opt.step()
                    self.assertIs(ctx.exception.status, mo.Status.INVALID_STATE)
                    opt.set_step_args(lr=0.02, adam_lr=0.01, weight_decay=0.1, adam_weight_decay=0.01)
                for step in range(3):
                    opt.zero_grad()
                    for v in views:
                        opt.wait_params(v.bucket)
                    for p in reversed(range(len(views))):
                        views[p].grad[:] = array.array("f", [rank_grad(step, 0, p, i) for i in range(views[p].numel)])
                        opt.grad_ready(p)
                    if preset:
                        self.assertEqual(opt.step().step, step + 1)
                        opt.join()  # the capture form ends each iteration with a join
                    else:
                        opt.step(lr=0.02, adam_lr=0.01, weight_decay=0.1, adam_weight_decay=0.01)
                return snapshot(opt, views)

        self.assertEqual(run(preset=True), run(preset=False))
        with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
            with self.assertRaises(ValueError):
                opt.step(lr=0.02)
            with self.assertRaises(ValueError):
                opt.step(weight_decay=0.1)

    def test_plan_json_is_json(self):
        with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
            opt.add_param("w", (16, 8))
            opt.finalize()
            self.assertEqual(json.loads(opt.plan_json()), opt.plan())
            self.assertEqual(opt.num_buckets(), len(opt.plan()["buckets"]))


class Checkpoints(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name) / "ckpt"

    def tearDown(self):
        self.tmp.cleanup()

    def test_load_union_reads_each_param_from_the_checkpoint_that_holds_it(self):
        dirs = [Path(self.tmp.name) / "a", Path(self.tmp.name) / "b"]
        values = {}
        for directory, name in zip(dirs, ["w0", "w1"]):
            with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
                pid = opt.add_param(name, (16, 8), dtype=mo.Dtype.F32, init=array.array("f", [0.5] * 128))
                opt.finalize()
                opt.zero_grad()
                opt.param_view(pid).grad[:] = array.array("f", [0.25] * 128)
                opt.grad_ready(pid)
                opt.step(lr=0.02, adam_lr=1e-3)
                opt.wait_params(opt.param_view(pid).bucket)
                values[name] = opt.param_view(pid).data.tobytes()
                opt.save(directory)
        with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
            ids = [opt.add_param(name, (16, 8), dtype=mo.Dtype.F32) for name in ["w0", "w1"]]
            opt.finalize()
            with self.assertRaises(mo.MuonError) as ctx:
                opt.load_union(dirs[:1])
            self.assertIs(ctx.exception.status, mo.Status.CHECKPOINT_MISMATCH)
            opt.load_union(dirs)
            for pid, name in zip(ids, ["w0", "w1"]):
                opt.wait_params(opt.param_view(pid).bucket)
                self.assertEqual(opt.param_view(pid).data.tobytes(), values[name])
            self.assertEqual(opt.step_info().step, 1)

    def test_resume_replays_bitwise_and_loads_at_another_dp(self):
        def body(comm):
            grads = lambda s, p, i: rank_grad(s, comm.rank, p, i)  # noqa: E731
            with mo.Optimizer(config(), comm) as opt:
                views = register(opt)
                run_steps(opt, views, range(0, 2), grads)
                saved = snapshot(opt, views)
                opt.save(self.dir)  # collective: both ranks, same directory
                run_steps(opt, views, range(2, 4), grads)
                first = snapshot(opt, views)
                opt.load(self.dir)
                loaded = snapshot(opt, views)
                run_steps(opt, views, range(2, 4), grads)
                return saved, loaded, first, snapshot(opt, views)

        for saved, loaded, first, replay in run_ranks(2, body):
            self.assertEqual(loaded, saved, "load restores the params of the save")
            self.assertEqual(replay, first, "resuming replays the same steps bit for bit")
            self.assertNotEqual(first, saved)

        def single(comm):  # the 2-rank checkpoint at dp 1
            with mo.Optimizer(config(), comm) as opt:
                views = register(opt)
                opt.load(self.dir)
                return snapshot(opt, views)

        (at_dp1,) = run_ranks(1, single)
        self.assertEqual(at_dp1, saved)

    def test_load_errors(self):
        with mo.HostGroup(1) as group, mo.Optimizer(config(), group[0]) as opt:
            register(opt)
            with self.assertRaises(mo.MuonError) as ctx:
                opt.load(self.dir / "missing")
            self.assertIs(ctx.exception.status, mo.Status.IO_ERROR)
            self.assertTrue(ctx.exception.message)


def register(opt):
    for name, shape, flags, tie in MODEL:
        opt.add_param(name, shape, dtype=mo.Dtype.F32, flags=flags, tie_group=tie, init=initial(name, shape))
    opt.finalize()
    return [opt.param_view(p) for p in range(len(MODEL))]


def run_steps(opt, views, steps, grads_for):
    for step in steps:
        opt.zero_grad()
        for v in views:
            opt.wait_params(v.bucket)
        for p in reversed(range(len(views))):
            views[p].grad[:] = array.array("f", [grads_for(step, p, i) for i in range(views[p].numel)])
            opt.grad_ready(p)
        opt.step(lr=0.02, adam_lr=0.01, weight_decay=0.1, adam_weight_decay=0.01)


def snapshot(opt, views):
    for v in views:  # the last step's param collectives
        opt.wait_params(v.bucket)
    return b"".join(v.data.tobytes() for v in views)


if __name__ == "__main__":
    unittest.main()
