"""The module hooks of :class:`muon_opt.torch.Muon` with ``param_sharding="sharded"``, as FSDP2
users expect them: a forward pre-hook gathers the buckets of a module's params (and prefetches
``param_prefetch_buckets`` ahead in forward order), a forward hook releases a bucket after the
last module using it when ``reshard_after_forward``, a backward pre-hook gathers them again
(prefetching in reverse forward order), and the post-accumulate-grad hook reports each gradient
ready — the library reduces a bucket to its owners once all are — and releases a bucket whose
gradients are all reported. The library keeps the authoritative state and refuses any misuse
(``MuonError`` with ``Status.INVALID_STATE`` naming the param and the bucket); this class only
decides when to call it.
"""

from ._capi import MuonError
from . import Status


class Window:
    """Which buckets this rank has gathered, and when to gather and release them."""

    def __init__(self, opt, config, plan):
        buckets = plan["buckets"]
        self._opt = opt
        self._order = sorted(range(len(buckets)), key=lambda b: (min(buckets[b]["params"], default=1 << 32), b))
        self._position = {b: i for i, b in enumerate(self._order)}
        self._params = [list(bucket["params"]) for bucket in buckets]
        self.bucket_of = {pid: b for b, params in enumerate(self._params) for pid in params}
        self._ahead = int(config.param_prefetch_buckets)
        self._reshard = bool(config.reshard_after_forward)
        # A bucket's slot is its forward position modulo the slots (the library's rule).
        self._slots = max(1, min(self._ahead + 1, len(buckets)) if self._reshard else len(buckets))
        self._held = set()
        self._ready = [set() for _ in buckets]

    def views(self, count):
        """Every param's view: each bucket gathered in forward order for its views and released
        (a bucket's views are the same at every gather)."""
        views = [None] * count
        for b in self._order:
            self._opt.gather_params(b)
            for pid in self._params[b]:
                views[pid] = self._opt.param_view(pid)
            self._opt.release_params(b)
        return views

    def install(self, module, pid_of):
        """The hooks on every module of ``module`` that owns params (``pid_of``: id(param) to
        the library's param id); returns their handles."""
        last = {}
        for m in module.modules():
            for p in m.parameters(recurse=False):
                last[self.bucket_of[pid_of[id(p)]]] = m
        hooks = []
        for m in module.modules():
            own = sorted({self.bucket_of[pid_of[id(p)]] for p in m.parameters(recurse=False)}, key=self._position.get)
            if not own:
                continue
            hooks.append(m.register_forward_pre_hook(lambda _m, _args, b=own: self._use(b, 1)))
            done = [b for b in own if last[b] is m]
            if self._reshard and done:
                hooks.append(m.register_forward_hook(lambda _m, _args, _out, b=done: self._release(b)))
            hooks.append(m.register_full_backward_pre_hook(lambda _m, _grads, b=own: self._use(b, -1)))
        return hooks

    def _slot(self, b):
        return self._position[b] % self._slots

    def _use(self, buckets, direction):
        """Gathers ``buckets`` (the caller's stream waits for them) and prefetches the buckets
        ahead of them in ``direction`` (1: forward order, -1: its reverse)."""
        for b in buckets:
            self._opt.wait_params(b)
            self._held.add(b)
        edge = self._position[buckets[-1] if direction > 0 else buckets[0]]
        for k in range(1, self._ahead + 1):
            position = edge + direction * k
            if 0 <= position < len(self._order):
                self._prefetch(self._order[position])

    def _prefetch(self, b):
        if b in self._held or any(self._slot(h) == self._slot(b) for h in self._held):
            return
        try:
            self._opt.gather_params(b)
        except MuonError as e:
            # The slot still holds a released bucket whose reduction waits for earlier buckets'
            # gradients: the bucket is gathered at its use instead, where a refusal is raised.
            if e.status != Status.INVALID_STATE:
                raise
            return
        self._held.add(b)

    def _release(self, buckets):
        for b in buckets:
            if b in self._held:
                self._opt.release_params(b)
                self._held.discard(b)

    def grad_ready(self, pid):
        """Reports param ``pid``'s gradient; a bucket whose every gradient is reported is released."""
        self._opt.grad_ready(pid)
        b = self.bucket_of[pid]
        self._ready[b].add(pid)
        if len(self._ready[b]) == len(self._params[b]):
            self._release([b])

    def released_all(self):
        """After a step or a load, which release every bucket."""
        self._held.clear()
        for ready in self._ready:
            ready.clear()

    def read(self, read):
        """``read(pid)`` for every param, each bucket gathered for it and released; returns the
        results by param id (outside a forward and backward: every bucket must be released)."""
        out = {}
        for b in self._order:
            self._opt.wait_params(b)
            for pid in self._params[b]:
                out[pid] = read(pid)
            self._opt.release_params(b)
        return out
