"""PyTorch adapter: a ``torch.nn.Module`` trained by libmuon_opt (requires ``torch``).

::

    import muon_opt as mo
    from muon_opt.torch import Muon

    opt = Muon(model, comm, lr=0.02, adam_lr=3e-4, embedding_or_output=["lm_head.weight"])
    for batch in loader:
        opt.zero_grad()
        loss = model(batch).mean()
        loss.backward()          # grads reach their owners during backward
        info = opt.step()        # params come back during the next forward

What the constructor does, once every rank has built the same model:

1. registers every parameter (``module.named_parameters()``: registration order, which is the
   forward order of a sequential model; a parameter shared by two modules, e.g. a tied embedding
   and output head, is one parameter) with its values as ``init``;
2. plans (``finalize``, collective) and rebinds every ``param.data`` and ``param.grad`` to the
   library's storage, so autograd accumulates straight into the buckets the library reduces;
3. installs a forward pre-hook on every module that owns parameters (``wait_params`` of their
   buckets) and a post-accumulate-grad hook on every parameter (``grad_ready``).

Routing: ``nn.Embedding`` weights and the names in ``embedding_or_output`` are flagged
``EMBEDDING_OR_OUTPUT`` (AdamW); parameters of fewer than 2 dimensions (biases, norms) get no
weight decay unless ``no_weight_decay`` says otherwise; the library routes every other 2-D
matrix to Muon. An output head not tied to the embedding must be named in
``embedding_or_output``: with ``vocab_size`` 0 (the default) the library takes the
embeddings' rows as the vocabulary, and finalize refuses a Muon-routed matrix with that many
rows, naming it (``MuonError``, ``ROUTING_CONFLICT``).

Fused matrices: ``splits`` maps a parameter name to the row sizes of its components, each
orthogonalized on its own — ``{"attn.qkv.weight": (q, k, v)}`` — or to ``(sizes, groups)`` when
the sizes repeat ``groups`` times along the rows (Megatron's QKV per query group:
``((q_per_group, k_per_group, v_per_group), query_groups)``; SwiGLU's gate|up: ``(ffn, ffn)``). Hyperparameters live in ``param_groups[0]`` (``lr``, ``weight_decay``,
``adam_lr``, ``adam_weight_decay``) so ``torch.optim.lr_scheduler`` drives ``lr``.

QK-clip (Kimi K2's MuonClip, Megatron-LM's ``--qk-clip``): ``qk_clip`` maps a parameter name
to its head layout — ``dict(kind="fused_qkv"|"query"|"key"|"mla_query"|"mla_key_value",
num_heads=…, head_dim=…, num_query_groups=…, rope_dim=…, v_head_dim=…)`` — and
``qk_clip_threshold`` / ``qk_clip_alpha`` set τ and α. Each iteration, hand the forward's
per-head max logits (a float32 tensor of ``num_heads`` values, already MAX-all-reduced over the
data-parallel ranks) to :meth:`Muon.set_max_logits`; the next ``step()`` clips those params on
their owners after the update, and every rank's copy follows.

Newton–Schulz method: ``ns_method="gram"`` (DeepSpeed's option of that name) runs the Gram
Newton–Schulz iteration on the matrices where it applies (long side ≥ 1.5× the short one;
in bf16 also ≤ 5 steps and not ``polar_express``: ``muon_config_t.muon_ns_method``), and the
standard one elsewhere; ``"standard"`` (the default, Megatron-LM's) the standard one
everywhere. The two agree up to rounding. It overrides ``config.muon_ns_method``.

Gradient accumulation: inside ``with opt.no_sync():`` backward passes accumulate without
reporting grads ready (as DDP's ``no_sync``); the last micro-batch's backward, outside it,
reports them. ``zero_grad()`` zeroes the library's grad buffer in place (grads are never set to
None: they are views).

The CUDA backend (an NCCL :class:`muon_opt.Comm`): pass the cudaStream_t the model runs on,
``stream=torch.cuda.current_stream().cuda_stream``; params and grads are rebound to device
memory through ``__cuda_array_interface__``. How to obtain the ``ncclComm_t`` is described in
``bindings/python/README.md``.
"""

import contextlib
import ctypes

import torch

from . import Dtype, NsMethod, Optimizer, Ownership, ParamFlag, QkClip, QkKind, Route

_DTYPES = {torch.float32: Dtype.F32, torch.bfloat16: Dtype.BF16}
_ELEMENT_BYTES = {Dtype.F32: 4, Dtype.BF16: 2}


def _split_of(name, spec):
    """``splits[name]`` as (sizes, groups): a sequence of sizes, or (sizes, groups)."""
    if len(spec) == 2 and not isinstance(spec[0], int):
        sizes, groups = spec
    else:
        sizes, groups = spec, None
    sizes = list(sizes)
    if not sizes or not all(isinstance(v, int) for v in sizes):
        raise TypeError(f"splits['{name}']: expected row sizes (ints) or (sizes, groups), got {spec!r}")
    return sizes, groups


_CHOICES = {
    "ns_method": ("muon_ns_method", {"standard": NsMethod.STANDARD, "gram": NsMethod.GRAM}),
    "ownership": ("muon_ownership", {"balanced": Ownership.BALANCED, "contiguous": Ownership.CONTIGUOUS}),
}


def _with_choice(config, argument, value):
    """A copy of ``config`` with the field of keyword ``argument`` set to what ``value`` names."""
    field, names = _CHOICES[argument]
    if value not in names:
        raise ValueError(f"{argument}: expected one of {sorted(names)}, got {value!r}")
    return type(config)(**dict(config.as_dict(), **{field: names[value]}))


_QK_KINDS = {
    "fused_qkv": QkKind.FUSED_QKV,
    "query": QkKind.QUERY,
    "key": QkKind.KEY,
    "mla_query": QkKind.MLA_QUERY,
    "mla_key_value": QkKind.MLA_KEY_VALUE,
}
_QK_FIELDS = {"kind", "num_heads", "head_dim", "num_query_groups", "rope_dim", "v_head_dim"}


def _qk_layout(name, layout):
    """``qk_clip[name]`` as QkClip fields (kind by name)."""
    layout = dict(layout)
    unknown = set(layout) - _QK_FIELDS
    if unknown or "kind" not in layout or layout["kind"] not in _QK_KINDS:
        raise ValueError(
            f"qk_clip['{name}']: expected kind in {sorted(_QK_KINDS)} and fields of {sorted(_QK_FIELDS)}, got {layout!r}"
        )
    layout["kind"] = _QK_KINDS[layout["kind"]]
    return layout


class Muon(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` over one rank's :class:`muon_opt.Optimizer`.

    ``module``: the model (the same on every rank); ``comm``: this rank's Comm; ``config``: a
    :class:`muon_opt.Config` (default: the library's defaults with ``grad_dtype`` equal to the
    model's dtype — torch keeps ``.grad`` in the param's dtype, so the two must agree);
    ``ns_method``: ``"standard"`` or ``"gram"``, in place of the config's ``muon_ns_method``;
    ``ownership``: ``"balanced"`` or ``"contiguous"``, in place of its ``muon_ownership`` (the
    config passed is not changed).
    """

    def __init__(
        self,
        module,
        comm,
        config=None,
        *,
        lr=0.02,
        weight_decay=0.1,
        adam_lr=3e-4,
        adam_weight_decay=0.1,
        embedding_or_output=(),
        no_weight_decay=None,
        splits=None,
        stream=None,
        qk_clip=None,
        qk_clip_threshold=100.0,
        qk_clip_alpha=0.5,
        ns_method=None,
        ownership=None,
    ):
        from . import Config

        named = list(module.named_parameters())
        if not named:
            raise ValueError("module has no parameters")
        dtypes = {p.dtype for _, p in named}
        for name, p in named:
            if p.dtype not in _DTYPES:
                raise TypeError(f"param '{name}' is {p.dtype}; the library stores float32 or bfloat16")
        if config is None:
            config = Config()
            if len(dtypes) == 1:
                config.grad_dtype = _DTYPES[dtypes.pop()]
        for argument, value in (("ns_method", ns_method), ("ownership", ownership)):
            if value is not None:
                config = _with_choice(config, argument, value)
        for name, p in named:
            if _DTYPES[p.dtype] != config.grad_dtype:
                raise ValueError(
                    f"param '{name}' is {p.dtype} but config.grad_dtype is {Dtype(config.grad_dtype).name}: "
                    "torch keeps .grad in the param's dtype, so every param must have the grad dtype"
                )
        embedding_weights = {
            id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)
        }
        unknown = set(embedding_or_output) - {name for name, _ in named}
        if unknown:
            raise ValueError(f"embedding_or_output names no parameter of the module: {sorted(unknown)}")
        no_decay = no_weight_decay if no_weight_decay is not None else (lambda name, p: p.dim() < 2)
        splits = dict(splits or {})
        unknown = set(splits) - {name for name, _ in named}
        if unknown:
            raise ValueError(f"splits names no parameter of the module: {sorted(unknown)}")
        self._splits = {name: _split_of(name, spec) for name, spec in splits.items()}
        qk_clip = dict(qk_clip or {})
        unknown = set(qk_clip) - {name for name, _ in named}
        if unknown:
            raise ValueError(f"qk_clip names no parameter of the module: {sorted(unknown)}")
        self._qk_layouts = {name: _qk_layout(name, layout) for name, layout in qk_clip.items()}
        self.qk_clip_threshold = qk_clip_threshold
        self.qk_clip_alpha = qk_clip_alpha
        self._max_logits = {}

        super().__init__(
            [p for _, p in named],
            dict(lr=lr, weight_decay=weight_decay, adam_lr=adam_lr, adam_weight_decay=adam_weight_decay),
        )
        self.config = config  # the Config the library optimizer was created with
        self._opt = Optimizer(config, comm, stream)
        self._host = comm.host
        self._report_grads = True
        self.names = [name for name, _ in named]
        self.last_info = None
        ids = {}
        for name, p in named:
            flags = 0
            if id(p) in embedding_weights or name in embedding_or_output:
                flags |= ParamFlag.EMBEDDING_OR_OUTPUT
            if no_decay(name, p):
                flags |= ParamFlag.NO_WEIGHT_DECAY
            ids[id(p)] = self._register(name, p, flags)
        self._ids = {name: ids[id(p)] for name, p in named}
        self._opt.finalize()
        self.views = [self._opt.param_view(i) for i in range(len(named))]
        for (name, p), view in zip(named, self.views):
            self._rebind(p, view)
            p.register_post_accumulate_grad_hook(lambda _p, pid=ids[id(p)]: self._grad_ready(pid))
        self._hooks = []
        for m in module.modules():
            buckets = sorted({self.views[ids[id(p)]].bucket for p in m.parameters(recurse=False)})
            if buckets:
                self._hooks.append(m.register_forward_pre_hook(lambda _m, _args, b=buckets: self._wait(b)))

    def _register(self, name, p, flags):
        dtype = _DTYPES[p.dtype]
        values = p.detach().contiguous()
        if self._host:
            init = memoryview((ctypes.c_char * (values.numel() * _ELEMENT_BYTES[dtype])).from_address(values.data_ptr()))
        else:
            init = values.data_ptr()
        sizes, groups = self._splits.get(name, (None, None))
        pid = self._opt.add_param(
            name,
            tuple(p.shape),
            dtype=dtype,
            flags=flags,
            split_sizes=sizes,
            split_groups=groups,
            init=init,
            init_dtype=dtype,
        )
        del values  # the library copied it
        return pid

    def _rebind(self, p, view):
        with torch.no_grad():
            p.data = self._tensor(view.data, view.data_ptr, p)
            p.grad = self._tensor(view.grad, view.grad_ptr, p)

    def _tensor(self, memory, address, p):
        if self._host:
            return torch.frombuffer(memory, dtype=p.dtype).view(p.shape)
        raw = torch.as_tensor(_CudaArray(address, p.numel(), p.element_size()), device=p.device)
        return raw.view(p.dtype).view(p.shape)

    def _wait(self, buckets):
        for b in buckets:
            self._opt.wait_params(b)

    def _grad_ready(self, pid):
        if self._report_grads:
            self._opt.grad_ready(pid)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients without reporting them ready."""
        previous, self._report_grads = self._report_grads, False
        try:
            yield
        finally:
            self._report_grads = previous

    def zero_grad(self, set_to_none=True):
        """Zeroes the grad buffers in place (``set_to_none`` is ignored: grads are views)."""
        self._opt.zero_grad()

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step with ``param_groups[0]``'s hyperparameters; returns the closure's
        loss if given, else the :class:`muon_opt.StepInfo` (also kept in ``last_info``)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._request_qk_clips()
        group = self.param_groups[0]
        info = self._opt.step(
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            adam_lr=group["adam_lr"],
            adam_weight_decay=group["adam_weight_decay"],
        )
        self.last_info = info
        return loss if closure is not None else info

    def set_max_logits(self, name, max_logits):
        """The per-head max pre-softmax logits of parameter ``name`` (listed in ``qk_clip``) for
        the next :meth:`step`: a float32 tensor of ``num_heads`` values on the model's device
        (kept alive until the step has read it)."""
        if name not in self._qk_layouts:
            raise ValueError(f"set_max_logits: '{name}' has no qk_clip layout")
        values = max_logits.detach().to(torch.float32).contiguous().reshape(-1)
        self._max_logits[name] = values

    def _request_qk_clips(self):
        if not self._max_logits:
            return
        clips = []
        for name, values in self._max_logits.items():
            maxima = values.cpu().tolist() if self._host else values.data_ptr()
            clips.append(QkClip(param_id=self._ids[name], max_logits=maxima, **self._qk_layouts[name]))
        try:
            self._opt.qk_clip(clips, threshold=self.qk_clip_threshold, alpha=self.qk_clip_alpha)
        finally:
            # The device reads the tensors in stream order during the step: keep them until then.
            self._pending_max_logits, self._max_logits = self._max_logits, {}

    def synchronize(self):
        """Waits for every bucket's params (before reading params outside a forward)."""
        self._wait(sorted({v.bucket for v in self.views}))

    def routes(self):
        """Parameter name -> :class:`muon_opt.Route`."""
        return {name: Route(v.route) for name, v in zip(self.names, self.views)}

    def state_dict(self):
        """The hyperparameters and step count. The optimizer state itself (fp32 masters,
        momenta, Adam moments) is sharded across ranks; :meth:`save` and :meth:`load` write and
        read it as a checkpoint directory that reloads at any data-parallel size."""
        return {
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups],
            "step": self.last_info.step if self.last_info else 0,
        }

    def load_state_dict(self, state_dict):
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            group.update(saved)

    def save(self, directory):
        """Collective: the sharded optimizer state into ``directory`` (same path on every rank)."""
        self._opt.save(directory)

    def load(self, directory):
        """Collective: the state of ``directory`` (any dp size); params re-synchronized."""
        self._opt.load(directory)

    def close(self):
        """Removes the hooks and closes the library optimizer (tensors keep its memory alive)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._opt.close()


class _CudaArray:
    """A device buffer of ``numel`` elements of ``itemsize`` bytes, described to torch through
    ``__cuda_array_interface__`` (version 3) as integers of that size, then viewed as the
    dtype (the interface has no bfloat16 type string)."""

    def __init__(self, address, numel, itemsize):
        self.__cuda_array_interface__ = {
            "shape": (numel,),
            "typestr": {2: "<i2", 4: "<i4"}[itemsize],
            "data": (address, False),
            "version": 3,
            "strides": None,
        }
