"""``Muon.state_dict`` / ``load_state_dict`` (issue 42): the optimizer state as tensors in
global coordinates; a standard torch training script (scheduler, GradScaler,
``model.zero_grad()``, ``torch.save`` of the state dicts) saved at one data-parallel size
resumes at another bit for bit, through ``torch.save`` and through
``torch.distributed.checkpoint``.

Every rank trains on the whole batch, so the summed gradient over 2 ranks is exactly twice one
rank's and the mean exactly one rank's: dp 1 and dp 2 give the same bits, and a resume at
another dp can be compared bitwise with the uninterrupted run.

Skipped without torch; CI sets MUON_REQUIRE_TORCH=1 so that it cannot be skipped there.
"""

import os
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import muon_opt as mo  # noqa: E402

try:
    import torch
    import torch.distributed.checkpoint as dcp
    from muon_opt.torch import Muon
    from test_torch import batch, config, make_model, run_ranks
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
    if os.environ.get("MUON_REQUIRE_TORCH") == "1":
        raise

TOTAL, SAVE_AT = 8, 4


def standard_script(comm, steps, start=0, save=None, resume=None):
    """A torch training loop with Muon in place of AdamW: (losses, final params)."""
    model = make_model()
    if resume is not None:
        checkpoint = resume()
        model.load_state_dict(checkpoint["model"])
    opt = Muon(model, comm, config(), lr=0.02, adam_lr=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=TOTAL)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    if resume is not None:
        opt.load_state_dict(checkpoint["opt"])
        sched.load_state_dict(checkpoint["sched"])
        scaler.load_state_dict(checkpoint["scaler"])
    losses = []
    for step in range(start, start + steps):
        tokens, targets = batch(step)
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens), targets)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        scaler.step(opt)
        assert opt.last_info.grad_norm > 0, f"step {step}: no gradient reached the optimizer"
        scaler.update()
        sched.step()
        losses.append(float(loss.detach()))
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
             "scaler": scaler.state_dict()}
    if save is not None:
        save(comm.rank, state)
    opt.synchronize()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.close()
    return losses, params


@unittest.skipIf(torch is None, "torch is not installed")
class StateDict(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.losses, cls.params = run_ranks(1, lambda comm, world: standard_script(comm, TOTAL))[0]

    def assert_resumes(self, first_dp, then_dp, save, load):
        head = run_ranks(first_dp, lambda comm, world: standard_script(comm, SAVE_AT, save=save))
        tail = run_ranks(then_dp, lambda comm, world: standard_script(comm, TOTAL - SAVE_AT, SAVE_AT, resume=load))
        for losses, params in tail:
            self.assertEqual(head[0][0] + losses, self.losses)
            for name, value in self.params.items():
                self.assertTrue(torch.equal(params[name], value), name)

    def test_torch_save_resumes_at_another_dp_bitwise(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "ckpt.pt"

            def save(rank, state):
                if rank == 0:
                    torch.save(state, path)

            self.assert_resumes(2, 1, save, lambda: torch.load(path, weights_only=False))
            self.assert_resumes(1, 2, save, lambda: torch.load(path, weights_only=False))

    def test_distributed_checkpoint_resumes_at_another_dp_bitwise(self):
        with tempfile.TemporaryDirectory() as tmp:

            def save(rank, state):
                if rank == 0:  # without a process group DCP saves what this rank holds: all of it
                    dcp.save(state["opt"], checkpoint_id=Path(tmp) / "opt")
                    torch.save({k: v for k, v in state.items() if k != "opt"}, Path(tmp) / "rest.pt")

            def load():
                rest = torch.load(Path(tmp) / "rest.pt", weights_only=False)
                template = torch.load(Path(tmp) / "template.pt", weights_only=False)
                dcp.load(template, checkpoint_id=Path(tmp) / "opt")
                return dict(rest, opt=template)

            # The template a fresh optimizer would give (state_dict before training): the same
            # keys and shapes at any dp, which DCP fills in place.
            def template(comm, world):
                model = make_model()
                opt = Muon(model, comm, config(), lr=0.02, adam_lr=0.01)
                torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=TOTAL)
                state = opt.state_dict()
                opt.close()
                return state

            torch.save(run_ranks(1, template)[0], Path(tmp) / "template.pt")
            self.assert_resumes(2, 1, save, load)

    def test_state_holds_the_moments_in_global_shapes(self):
        def body(comm, world):
            model = make_model()
            opt = Muon(model, comm, config(), lr=0.02, adam_lr=0.01)
            state = opt.state_dict()
            opt.close()
            return state, {n: tuple(p.shape) for n, p in model.named_parameters()}

        (state, shapes), (other, _) = run_ranks(2, body)
        names = state["muon_opt"]["names"]
        self.assertEqual(sorted(names), sorted(shapes))
        self.assertEqual(sum(len(g["params"]) for g in state["param_groups"]), len(names))
        for k, name in enumerate(names):
            kinds = ("master", "momentum") if name in ("fc1.weight", "fc2.weight") else ("master", "exp_avg", "exp_avg_sq")
            self.assertEqual(sorted(state["state"][k]), sorted(kinds), name)
            for kind in kinds:
                self.assertEqual(tuple(state["state"][k][kind].shape), shapes[name], (name, kind))
                self.assertTrue(torch.equal(state["state"][k][kind], other["state"][k][kind]), "ranks agree")

    def test_bad_state_is_refused_by_name(self):
        def body(comm, world):
            model = make_model()
            opt = Muon(model, comm, config())
            state = opt.state_dict()
            k = state["muon_opt"]["names"].index("fc1.weight")
            state["state"][k]["momentum"] = torch.zeros(3)
            try:
                opt.load_state_dict(state)
            finally:
                opt.close()

        with self.assertRaises(ValueError) as ctx:
            run_ranks(1, body)
        self.assertIn("param 'fc1.weight' needs 'momentum', a tensor of shape [32, 16], got (3,)", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
