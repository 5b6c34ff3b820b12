"""PyTorch adapter: a ``torch.nn.Module`` trained by libmuon_opt (requires ``torch``).

::

    import muon_opt as mo
    from muon_opt.torch import Muon

    opt = Muon(model, comm, embedding_or_output=["lm_head.weight"])   # lr 3e-3 for both groups
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    for batch in loader:
        model.zero_grad()        # or opt.zero_grad(): either works
        loss = model(batch).mean()
        loss.backward()
        info = opt.step()        # params come back during the next forward
        sched.step()
    torch.save(opt.state_dict(), "opt.pt")   # collective: the whole state, any dp reloads it

What the constructor does, once every rank has built the same model:

1. registers every parameter (``module.named_parameters()``: registration order, which is the
   forward order of a sequential model; a parameter shared by two modules, e.g. a tied embedding
   and output head, is one parameter) with its values as ``init``;
2. plans (``finalize``, collective) and rebinds every ``param.data`` and ``param.grad`` to the
   library's storage, so autograd accumulates straight into the buckets the library reduces;
3. installs a forward pre-hook on every module that owns parameters (``wait_params`` of their
   buckets) and a post-accumulate-grad hook on every parameter (``grad_ready``).

Routing: ``nn.Embedding`` weights and the names in ``embedding_or_output`` are flagged
``EMBEDDING_OR_OUTPUT`` (AdamW); the library routes every other 2-D matrix to Muon. Weight decay
follows the config's ``weight_decay_rule``, by default Megatron-LM's: 1-D parameters and those
named ``*.bias`` (biases, norms) get none; ``no_weight_decay(name, param) -> bool`` decides every
parameter instead (``NO_WEIGHT_DECAY`` or ``WEIGHT_DECAY`` flags). An output head not tied to the embedding must be named in
``embedding_or_output``: with ``vocab_size`` 0 (the default) the library takes the
embeddings' rows as the vocabulary, and finalize refuses a Muon-routed matrix with that many
rows, naming it (``MuonError``, ``ROUTING_CONFLICT``).

Fused matrices: ``splits`` maps a parameter name to the row sizes of its components, each
orthogonalized on its own — ``{"attn.qkv.weight": (q, k, v)}`` — or to ``(sizes, groups)`` when
the sizes repeat ``groups`` times along the rows (Megatron's QKV per query group:
``((q_per_group, k_per_group, v_per_group), query_groups)``; SwiGLU's gate|up: ``(ffn, ffn)``).

Param groups: by default a ``"muon"`` group (``lr``, ``weight_decay``) and an ``"adamw"`` group
(``adam_lr``, ``adam_weight_decay``, default ``lr`` and ``weight_decay``), and with
``decoupled_lr`` a ``"decoupled"`` AdamW group of the embedding and output params at that
``lr`` (Megatron-LM's ``--decoupled-lr``, which applies to its params with
``is_embedding_or_output_parameter``; its ``--decoupled-min-lr`` is that group's floor in the
scheduler, e.g. a per-group ``LambdaLR``), each driven by any ``torch.optim.lr_scheduler``; or ``param_groups=[{"params": [...], "use_muon": True|False,
"lr": …, "weight_decay": …, "lr_scale": …, "wd_scale": …}]`` (params as tensors or names, each
in one group; ``use_muon`` as in KellerJordan/Muon's ``MuonWithAuxAdam``). Every group follows
its own schedule: each step gives every param its group's current ``lr`` and ``weight_decay``
(times the group's ``lr_scale`` / ``wd_scale``) through ``muon_optimizer_set_param_scales``, see
``_torch_groups.py``.

Momentum and betas: every step also passes the Muon groups' ``momentum`` and the AdamW groups'
``betas`` and ``eps`` as the step's overrides of the config's (``muon_step_args_t.overrides``),
so a scheduler or the training loop may change them every step — OneCycleLR or CyclicLR with
``cycle_momentum=True``, a Muon momentum warmup as Moonlight and Kimi K2 schedule it
(``for g in opt.param_groups: if g["use_muon"]: g["momentum"] = ...``). AdamW's bias corrections
follow torch.optim.AdamW: ``1 - β**t`` with the step's β and step count ``t``. The library steps
every param of a route with one momentum (one β1, β2, ε): groups of a route with different
values are refused (ValueError naming both). In every group ``momentum`` and ``betas[0]`` are
one value, the group's first-moment coefficient (μ for Muon, β1 for AdamW; a group starts with
its route's value from the config): OneCycleLR and CyclicLR cycle ``betas[0]`` of every group
(this optimizer's defaults carry ``betas``), which thus drives Muon's momentum and AdamW's β1
alike; the step takes whichever of the two changed and sets the other to it. ``nesterov`` is
the config's, fixed. ``state_dict`` keeps the groups' values, so a resumed run steps with them.

Defaults (Moonlight's convention, "Muon is Scalable for LLM Training", arXiv:2502.16982): the
Muon update is ``lr · 0.2 · √max(m, n) · NS(M)`` (the library's spectral scale with
``muon_extra_scale_factor`` 0.2, an explicit ``config`` keeps its own), whose RMS matches
AdamW's, so one ``lr`` (3e-3) serves both groups; weight decay 0.1.
``examples/compare_lm.py`` trains a 2-layer transformer LM with these defaults beside
``torch.optim.AdamW`` and ``torch.optim.Muon`` and prints the loss table.

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

Variant: ``variant="normuon"`` trains the Muon params with NorMuon (Megatron-LM's
``--optimizer adaptive_muon`` with ``moment2_method="normuon"``, Emerging-Optimizers'
``AdaptiveMuon``): each orthogonalized update is divided by the root of an EMA (β2
``config.adaptive_muon_beta2``, default 0.95) of its mean square per row or column (the longer
side) and brought back to its own norm before the scale; its state holds one more float per
row or column. ``variant="adamuon"`` trains them with AdaMuon (the same flag with
``moment2_method="adamuon"``, Megatron-LM's default): each element of the orthogonalized update
is divided by the root of an EMA of its own square plus ε (``config.adaptive_muon_eps``, default
1e-8) before the scale; its state holds one more float per element. ``"standard"`` (the
default) is Muon. It overrides ``config.muon_variant``.

Grads: every ``.grad`` is a view of the library's buffer. Torch setting it to None
(``model.zero_grad()``) or replacing it (a hook, a scaler) is harmless: the grad hook and
``step()`` move the values into the buffer and rebind it. ``opt.zero_grad()`` zeroes the buffer
in place (``set_to_none`` leaves zeros). By default the gradient collectives run in ``step()``,
so in-place changes after backward (``clip_grad_norm_``, ``GradScaler.unscale_``) count;
``overlap_grad_reduce=True`` starts them during backward instead, and ``step()`` then refuses,
naming the param, a grad changed, replaced or set to None after backward. Gradient
accumulation: inside ``with opt.no_sync():`` backward passes accumulate without reporting
grads ready (as DDP's ``no_sync``).

Checkpoints: ``state_dict()`` (collective) holds torch's ``state`` — per param its fp32
``master`` and ``momentum`` or ``exp_avg`` / ``exp_avg_sq``, whole, in the param's shape — read
from the library's checkpoint (docs/checkpoint.md) that it saves into ``state_dir`` (default on
a host group: a temp directory, removed at exit; required on the cuda backend: a directory
every rank shares); ``load_state_dict`` writes it back as a one-rank checkpoint and loads it at
this optimizer's dp. ``torch.save`` and ``torch.distributed.checkpoint`` both keep it.

One optimizer per model: a second ``Muon`` on a model with an open one is refused;
``close()`` removes every hook it installed.

The CUDA backend (an NCCL :class:`muon_opt.Comm`): pass the cudaStream_t the model runs on,
``stream=torch.cuda.current_stream().cuda_stream``; params and grads are rebound to device
memory through ``__cuda_array_interface__``. How to obtain the ``ncclComm_t`` is described in
``bindings/python/README.md``.
"""

import atexit
import contextlib
import ctypes
import shutil
import tempfile
import weakref
from pathlib import Path

import torch

from . import Dtype, MuonVariant, NsMethod, Optimizer, Ownership, ParamFlag, ParamSharding, QkClip, QkKind, Route
from ._window import Window
from . import _torch_groups as _groups
from . import _torch_state as _state
from ._qk_layout import check_maxima_count, expected_rows

# Moonlight's update scale ("Muon is Scalable for LLM Training", Liu et al. 2025,
# arXiv:2502.16982, §2.2): lr · 0.2 · √max(m, n) · NS(M) has the RMS (≈ 0.2) of an AdamW
# update, so one lr serves the Muon and the AdamW params. The library's spectral scale
# √max(m, n) times muon_extra_scale_factor 0.2 is that update.
MOONLIGHT_SCALE = 0.2
DEFAULT_LR = 3e-3

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
    "ownership": (
        "muon_ownership",
        {"balanced": Ownership.BALANCED, "contiguous": Ownership.CONTIGUOUS, "auto": Ownership.AUTO},
    ),
    "variant": (
        "muon_variant",
        {"standard": MuonVariant.STANDARD, "normuon": MuonVariant.NORMUON, "adamuon": MuonVariant.ADAMUON},
    ),
    "param_sharding": (
        "param_sharding",
        {"replicated": ParamSharding.REPLICATED, "sharded": ParamSharding.SHARDED},
    ),
}


def _momentum_dtype(dtype):
    """The Dtype code of the ``momentum_dtype`` keyword (torch.float32 or torch.bfloat16)."""
    if dtype not in _DTYPES:
        raise ValueError(f"momentum_dtype: expected torch.float32 or torch.bfloat16, got {dtype!r}")
    return int(_DTYPES[dtype])


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


def _default_groups(named, routes, defaults, decoupled_lr, embedding_or_output, embedding_weights):
    """The groups without ``param_groups``: "muon" and "adamw", and with ``decoupled_lr`` the
    "decoupled" group of the params flagged ``EMBEDDING_OR_OUTPUT`` (AdamW, at ``decoupled_lr``);
    empty ones left out."""

    def group_of(name, p):
        if routes[id(p)] == Route.MUON:
            return "muon"
        if decoupled_lr is not None and (id(p) in embedding_weights or name in embedding_or_output):
            return "decoupled"
        return "adamw"

    groups = []
    for group, use_muon in (("muon", True), ("adamw", False), ("decoupled", False)):
        values = dict(defaults[use_muon], lr=decoupled_lr) if group == "decoupled" else defaults[use_muon]
        params = [p for name, p in named if group_of(name, p) == group]
        if params:
            groups.append(dict(values, use_muon=use_muon, name=group, lr_scale=1.0, wd_scale=1.0, params=params))
    return groups


def _owner(p):
    """The open Muon training ``p``, or None."""
    ref = getattr(p, "_muon_opt_owner", None)
    return ref() if ref is not None else None


class Muon(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` over one rank's :class:`muon_opt.Optimizer`.

    ``module``: the model (the same on every rank); ``comm``: this rank's Comm; ``config``: a
    :class:`muon_opt.Config` (default: the library's defaults with ``grad_dtype`` equal to the
    model's dtype — torch keeps ``.grad`` in the param's dtype, so the two must agree — and
    ``muon_extra_scale_factor`` 0.2, Moonlight's convention); ``ns_method``: ``"standard"`` or
    ``"gram"``, in place of the config's ``muon_ns_method``; ``ownership``: ``"auto"``,
    ``"balanced"`` or ``"contiguous"``, in place of its ``muon_ownership``; ``variant``:
    ``"standard"``, ``"normuon"`` or ``"adamuon"``, in place of its ``muon_variant``;
    ``param_sharding``: ``"replicated"`` or ``"sharded"`` (ZeRO-3 style with whole-matrix owners,
    with FSDP2's module hooks: ``muon_opt._window``; a param exists only while its bucket is
    gathered, so read params outside a forward with :meth:`named_param_values`), with
    ``reshard_after_forward`` and ``param_prefetch_buckets``, in
    place of the config's fields of those names; ``cautious_weight_decay``: True decays a
    weight (Muon and AdamW) only where it and its update share a sign (microsoft/dion's
    ``cautious_wd``), in place of the config's field; ``momentum_dtype``: ``torch.float32`` or
    ``torch.bfloat16``, the storage of the Muon momentum (dion's ``momentum_dtype``), in place of
    the config's ``muon_momentum_dtype``; ``network`` and
    ``expert_network``: ``(hop_latency_us, bus_bandwidth_gbps)`` of the data-parallel (and
    expert data-parallel) ring, in place of the config's (the config passed is not changed).
    See the module's docstring for the groups, the grads, ``state_dict`` and the defaults.
    """

    def __init__(
        self,
        module,
        comm,
        config=None,
        *,
        lr=DEFAULT_LR,
        weight_decay=0.1,
        adam_lr=None,
        adam_weight_decay=None,
        decoupled_lr=None,
        param_groups=None,
        embedding_or_output=(),
        no_weight_decay=None,
        splits=None,
        stream=None,
        qk_clip=None,
        qk_clip_threshold=100.0,
        qk_clip_alpha=0.5,
        ns_method=None,
        ownership=None,
        network=None,
        expert_network=None,
        variant=None,
        param_sharding=None,
        reshard_after_forward=None,
        param_prefetch_buckets=None,
        cautious_weight_decay=None,
        momentum_dtype=None,
        overlap_grad_reduce=False,
        state_dir=None,
    ):
        from . import Config

        named = list(module.named_parameters())
        if not named:
            raise ValueError("module has no parameters")
        for name, p in named:
            if p.dtype not in _DTYPES:
                raise TypeError(f"param '{name}' is {p.dtype}; the library stores float32 or bfloat16")
            owner = _owner(p)
            if owner is not None:
                raise ValueError(
                    f"param '{name}' is already trained by another muon_opt.torch.Muon (its hooks are still "
                    "installed); call close() on that optimizer first"
                )
        dtypes = {p.dtype for _, p in named}
        if config is None:
            config = Config(muon_extra_scale_factor=MOONLIGHT_SCALE)
            if len(dtypes) == 1:
                config.grad_dtype = _DTYPES[dtypes.pop()]
        choices = (("ns_method", ns_method), ("ownership", ownership), ("variant", variant))
        for argument, value in choices + (("param_sharding", param_sharding),):
            if value is not None:
                config = _with_choice(config, argument, value)
        for field, value in (
            ("network", network),
            ("expert_network", expert_network),
            ("reshard_after_forward", None if reshard_after_forward is None else int(bool(reshard_after_forward))),
            ("param_prefetch_buckets", param_prefetch_buckets),
            ("cautious_weight_decay", None if cautious_weight_decay is None else int(bool(cautious_weight_decay))),
            ("muon_momentum_dtype", None if momentum_dtype is None else _momentum_dtype(momentum_dtype)),
        ):
            if value is not None:
                config = type(config)(**dict(config.as_dict(), **{field: value}))
        for name, p in named:
            if _DTYPES[p.dtype] != config.grad_dtype:
                raise ValueError(
                    f"param '{name}' is {p.dtype} but config.grad_dtype is {Dtype(config.grad_dtype).name}: "
                    "torch keeps .grad in the param's dtype, so every param must have the grad dtype"
                )
        names = {name for name, _ in named}
        for argument, given in (("embedding_or_output", embedding_or_output), ("splits", splits or {}),
                                ("qk_clip", qk_clip or {})):
            unknown = set(given) - names
            if unknown:
                raise ValueError(f"{argument} names no parameter of the module: {sorted(unknown)}")
        embedding_weights = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
        if decoupled_lr is not None and param_groups is not None:
            raise ValueError(
                "decoupled_lr: with param_groups, put the embedding and output params in a group of their own with that lr"
            )
        self._splits = {name: _split_of(name, spec) for name, spec in dict(splits or {}).items()}
        self._qk_layouts = {name: _qk_layout(name, layout) for name, layout in dict(qk_clip or {}).items()}
        self.qk_clip_threshold = qk_clip_threshold
        self.qk_clip_alpha = qk_clip_alpha
        self._max_logits = {}
        self._pending_max_logits = {}
        defaults = {
            True: dict(lr=lr, weight_decay=weight_decay),
            False: dict(lr=lr if adam_lr is None else adam_lr,
                        weight_decay=weight_decay if adam_weight_decay is None else adam_weight_decay),
        }
        user_groups = None
        if param_groups is not None:
            user_groups, group_of = _groups.normalize(param_groups, named, defaults)

        self.config = config  # the Config the library optimizer was created with
        self._opt = Optimizer(config, comm, stream)
        try:
            self._host = comm.host
            self._overlap = bool(overlap_grad_reduce)
            self._report_grads = True
            self._reported = {}  # param id -> the grad's version when reported ready this iteration
            self._state_dir = state_dir
            self._group_key = comm.group_key
            self.names = [name for name, _ in named]
            self.last_info = None
            ids, routes = {}, {}
            for name, p in named:
                flags, scales = 0, {}
                if id(p) in embedding_weights or name in embedding_or_output:
                    flags |= ParamFlag.EMBEDDING_OR_OUTPUT
                if no_weight_decay is not None:
                    flags |= ParamFlag.NO_WEIGHT_DECAY if no_weight_decay(name, p) else ParamFlag.WEIGHT_DECAY
                if user_groups is not None:
                    g = group_of[id(p)]
                    if not user_groups[g]["use_muon"]:
                        flags |= ParamFlag.NO_MUON
                    scales = dict(zip(("lr_scale", "wd_scale"), _groups.rates(user_groups[g])))
                ids[id(p)] = self._register(name, p, flags, scales)
                routes[id(p)] = self._opt.param_route(ids[id(p)])
                if user_groups is not None and user_groups[group_of[id(p)]]["use_muon"] and routes[id(p)] != Route.MUON:
                    raise ValueError(
                        f"param_groups[{group_of[id(p)]}] has use_muon=True, but the library routes '{name}' "
                        f"(shape {tuple(p.shape)}) to AdamW (an embedding or output layer, or not a 2-D matrix): "
                        "put it in a use_muon=False group"
                    )
            self._ids = {name: ids[id(p)] for name, p in named}
            self._check_qk_layouts(dict(named), routes)
            if user_groups is None:
                user_groups = _default_groups(named, routes, defaults, decoupled_lr, embedding_or_output, embedding_weights)
            # Each param's (lr_scale, wd_scale) as the library holds them.
            self._scales = {ids[id(p)]: None for _, p in named}
            self._nesterov = bool(config.muon_nesterov)
            for group in user_groups:
                group.update(_groups.group_values(config, group["use_muon"]))
            self._constructing = True
            super().__init__(user_groups, _groups.optimizer_defaults(config))
            self._constructing = False
            # Each group's momentum (= betas[0]) at the last step, to tell which a scheduler set.
            self._first_moments = _groups.first_moments(self.param_groups)
            self._opt.finalize()
            self._window = None
            if config.param_sharding == ParamSharding.SHARDED:
                self._window = Window(self._opt, config, self._opt.plan())
                self.views = self._window.views(len(named))
            else:
                self.views = [self._opt.param_view(i) for i in range(len(named))]
            self._params = [p for _, p in named]
            self._pid_of = {id(p): pid for pid, p in enumerate(self._params)}
            self._grads = []
            self._hooks = []
            for (name, p), view in zip(named, self.views):
                self._rebind(p, view)
                self._grads.append(p.grad)
                self._hooks.append(p.register_post_accumulate_grad_hook(lambda q, pid=ids[id(p)]: self._grad_hook(q, pid)))
            if self._window is not None:
                self._hooks.extend(self._window.install(module, ids))
            for m in module.modules() if self._window is None else ():
                buckets = sorted({self.views[ids[id(p)]].bucket for p in m.parameters(recurse=False)})
                if buckets:
                    self._hooks.append(m.register_forward_pre_hook(lambda _m, _args, b=buckets: self._wait(b)))
        except BaseException:
            for h in getattr(self, "_hooks", []):
                h.remove()
            self._opt.close()
            raise
        for p in self._params:
            p._muon_opt_owner = weakref.ref(self)

    def add_param_group(self, param_group):
        """Only during construction: the library plans its buffers once, at finalize."""
        if not getattr(self, "_constructing", False):
            raise RuntimeError("add_param_group: muon_opt.torch.Muon plans every param at construction; "
                               "pass every group as param_groups=[...] to Muon(...)")
        super().add_param_group(param_group)

    def _check_qk_layouts(self, params, routes):
        """Each QK-clip layout against its param: a 2-D Muon matrix with the rows it implies."""
        for name, layout in self._qk_layouts.items():
            p = params[name]
            if routes[id(p)] != Route.MUON or p.dim() != 2:
                raise ValueError(
                    f"qk_clip['{name}']: QK-clip applies to 2-D Muon matrices; the param has shape "
                    f"{tuple(p.shape)} and is routed to {Route(routes[id(p)]).name}"
                )
            fields = {k: v for k, v in layout.items() if k != "kind"}
            rows = expected_rows(f"qk_clip['{name}']", layout["kind"], **fields)
            if rows != p.shape[0]:
                raise ValueError(
                    f"qk_clip['{name}']: the layout ({fields}) has {rows} rows, the param has {p.shape[0]}"
                )

    def _register(self, name, p, flags, scales):
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
            **scales,
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

    def _bound(self, pid):
        grad = self._params[pid].grad
        return grad is not None and grad.data_ptr() == self._grads[pid].data_ptr() and grad.shape == self._grads[pid].shape

    def _take_grad(self, pid):
        """Rebinds ``.grad`` to the library's buffer: torch set it to None (``zero_grad``, which
        means zero) or replaced it (a hook, a scaler); its values move into the buffer."""
        p, bound = self._params[pid], self._grads[pid]
        with torch.no_grad():
            if p.grad is None:
                bound.zero_()
            else:
                bound.copy_(p.grad)
            p.grad = bound

    def _wait(self, buckets):
        for b in buckets:
            self._opt.wait_params(b)

    def _grad_hook(self, _p, pid):
        if not self._bound(pid):
            self._take_grad(pid)  # accumulated into a new tensor: the grad was None or replaced
        if self._window is not None:
            self._window.grad_ready(pid)
        elif self._overlap and self._report_grads:
            self._opt.grad_ready(pid)
            self._reported[pid] = self._grads[pid]._version

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients without reporting them ready (not with
        sharded params, whose gradients exist only while their bucket is gathered: accumulate
        micro-batches into one backward there)."""
        if self._window is not None:
            raise RuntimeError(
                "no_sync: with param_sharding='sharded' each bucket's gradients are reduced to their owners "
                "and released as its backward ends; accumulate micro-batches into one backward"
            )
        previous, self._report_grads = self._report_grads, False
        try:
            yield
        finally:
            self._report_grads = previous

    def zero_grad(self, set_to_none=True):
        """Zeroes the grad buffers in place and rebinds every ``.grad`` to them: grads are the
        library's buffers, so ``set_to_none`` leaves zeros, not None (the same gradient)."""
        self._opt.zero_grad()
        for pid in range(len(self._params)):
            if not self._bound(pid):
                self._params[pid].grad = self._grads[pid]

    def _check_grads(self):
        """Every ``.grad`` is the library's buffer again before the step reads it; with
        ``overlap_grad_reduce`` a grad reported ready must not have changed since. With sharded
        params the gradients were reduced and released by the backward's hooks."""
        if self._window is not None:
            return
        for pid, name in enumerate(self.names):
            if pid in self._reported:
                if not self._bound(pid):
                    raise RuntimeError(
                        f"param '{name}': .grad was set to None or replaced after backward reported it ready; "
                        "with overlap_grad_reduce=True the library reduces it during backward: zero grads "
                        "before the forward, or construct Muon with overlap_grad_reduce=False"
                    )
                if self._grads[pid]._version != self._reported[pid]:
                    raise RuntimeError(
                        f"param '{name}': .grad was changed in place after backward reported it ready "
                        "(clip_grad_norm_, GradScaler.unscale_, a hook); with overlap_grad_reduce=True the "
                        "library reduces it during backward: clip with config.clip_grad, or construct Muon "
                        "with overlap_grad_reduce=False"
                    )
            elif not self._bound(pid):
                self._take_grad(pid)

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step with the groups' hyperparameters as they are now (``lr``,
        ``weight_decay``, ``momentum``, ``betas``, ``eps``: see the module's docstring); returns the
        closure's loss if given, else the :class:`muon_opt.StepInfo` (also kept in
        ``last_info``)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        _groups.check_nesterov(self.param_groups, self._nesterov)
        self._first_moments = _groups.sync_first_moments(self.param_groups, self._first_moments)
        overrides = _groups.step_overrides(self.param_groups)
        self._set_rates()
        self._check_grads()
        self._request_qk_clips()
        info = self._opt.step(lr=1.0, weight_decay=1.0, adam_lr=1.0, adam_weight_decay=1.0, **overrides)
        self._released_all()
        self._reported = {}
        self.last_info = info
        return loss if closure is not None else info

    def _set_rates(self):
        """Every param's group rates as its library scales (changed ones only): the step passes
        lr = weight decay = 1, so each group follows its own schedule."""
        for group in self.param_groups:
            rates = _groups.rates(group)
            for p in group["params"]:
                pid = self._pid_of[id(p)]
                if self._scales[pid] != rates:
                    self._opt.set_param_scales(pid, *rates)
                    self._scales[pid] = rates

    def set_max_logits(self, name, max_logits):
        """The per-head max pre-softmax logits of parameter ``name`` (listed in ``qk_clip``) for
        the next :meth:`step`: a floating tensor of ``num_heads`` values on the model's device
        (converted to float32, kept alive until the step has read it)."""
        if name not in self._qk_layouts:
            raise ValueError(f"set_max_logits: '{name}' has no qk_clip layout")
        if not isinstance(max_logits, torch.Tensor):
            raise TypeError(f"set_max_logits('{name}'): expected a tensor, got {type(max_logits).__name__}")
        if not max_logits.is_floating_point():
            raise TypeError(f"set_max_logits('{name}'): max_logits is {max_logits.dtype}; expected a floating dtype")
        device = self._params[self._ids[name]].device
        if max_logits.device != device:
            raise ValueError(f"set_max_logits('{name}'): max_logits is on {max_logits.device}, the param on {device}")
        if max_logits.dim() > 1:
            raise ValueError(f"set_max_logits('{name}'): max_logits has shape {tuple(max_logits.shape)}; expected 1-D")
        check_maxima_count(f"set_max_logits('{name}')", self._qk_layouts[name]["num_heads"], max_logits.numel())
        self._max_logits[name] = max_logits.detach().to(torch.float32).contiguous()

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
        """Waits for every bucket's params (before reading params outside a forward); with
        sharded params, for the library's streams (the params exist only while gathered: read
        them with :meth:`named_param_values`)."""
        if self._window is not None:
            self._opt.synchronize()
            return
        self._wait(sorted({v.bucket for v in self.views}))

    def named_param_values(self):
        """Every param's values by name, as copies; with sharded params each bucket is gathered
        for the copy and released (call it outside a forward and backward)."""
        if self._window is None:
            self.synchronize()
            return {name: p.detach().clone() for name, p in zip(self.names, self._params)}
        copies = self._window.read(lambda pid: self._params[pid].detach().clone())
        return {self.names[pid]: copies[pid] for pid in range(len(self._params))}

    def _released_all(self):
        if self._window is not None:
            self._window.released_all()

    def routes(self):
        """Parameter name -> :class:`muon_opt.Route`."""
        return {name: Route(v.route) for name, v in zip(self.names, self.views)}

    def _scratch(self):
        """The directory state_dict saves through: ``state_dir``, or on a host group (ranks are
        threads of this process) one under the temp dir named by the group, removed at exit."""
        if self._state_dir is not None:
            return Path(self._state_dir)
        if self._group_key is None:
            raise ValueError(
                "state_dict: Muon(state_dir=...) is required on the cuda backend: a directory on a file "
                "system every rank of the data-parallel group shares, the same path on every rank"
            )
        path = Path(tempfile.gettempdir()) / f"muon_opt-state-{self._group_key}"
        if path not in _SCRATCH:
            _SCRATCH.add(path)
            atexit.register(shutil.rmtree, path, True)
        return path

    def _order(self):
        """Params in torch's state_dict order (groups in order, then their params)."""
        return [p for group in self.param_groups for p in group["params"]]

    def state_dict(self):
        """Collective (every rank calls it): torch's layout — ``state`` (param index -> its fp32
        ``master`` and ``momentum``, or ``exp_avg`` and ``exp_avg_sq``, whole tensors in the
        param's shape, whatever rank owns them) and ``param_groups`` — plus ``muon_opt`` (the
        model description and step). Every rank returns the whole state, so ``torch.save`` on
        one rank or ``torch.distributed.checkpoint`` keeps all of it, and
        :meth:`load_state_dict` reads it at any data-parallel size."""
        directory = self._scratch() / "state_dict"
        self._opt.save(directory)
        model, tensors = _state.read(directory)
        name_of = {id(p): self.names[pid] for pid, p in enumerate(self._params)}
        order = self._order()
        index = {id(p): k for k, p in enumerate(order)}
        return {
            "state": {k: tensors[name_of[id(p)]] for k, p in enumerate(order)},
            "param_groups": [dict({k: v for k, v in g.items() if k != "params"}, params=[index[id(p)] for p in g["params"]])
                             for g in self.param_groups],
            "muon_opt": {"model": model, "names": [name_of[id(p)] for p in order]},
        }

    def load_state_dict(self, state_dict):
        """Collective: the state of :meth:`state_dict` (saved at any data-parallel size) and the
        groups' hyperparameters; params re-synchronized from the loaded masters."""
        order = self._order()
        name_of = {id(p): self.names[pid] for pid, p in enumerate(self._params)}
        ours = [name_of[id(p)] for p in order]
        saved = state_dict.get("muon_opt", {}).get("names")
        if saved != ours:
            raise ValueError(f"load_state_dict: the state is of params {saved}, this optimizer has {ours}")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(g["params"]) != len(ours_g["params"]) for g, ours_g in zip(groups, self.param_groups)
        ):
            raise ValueError("load_state_dict: param_groups differ in number or size from this optimizer's")
        tensors = {ours[k]: state_dict["state"][k] for k in range(len(ours))}
        scratch = Path(tempfile.mkdtemp(prefix="muon_opt-load-"))
        try:
            _state.write(scratch / "ckpt", state_dict["muon_opt"]["model"], tensors)
            self._opt.load(scratch / "ckpt")
            self._released_all()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        for group, saved_group in zip(self.param_groups, groups):
            group.update({k: v for k, v in saved_group.items() if k != "params"})

    def save(self, directory):
        """Collective: the sharded optimizer state into ``directory`` (same path on every rank)."""
        self._opt.save(directory)

    def load(self, directory):
        """Collective: the state of ``directory`` (any dp size); params re-synchronized."""
        self._opt.load(directory)
        self._released_all()

    def close(self):
        """Removes every hook it installed (forward pre-hooks, grad hooks) and closes the library
        optimizer (tensors keep its memory alive); the model can then get another optimizer."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for p in self._params:
            if _owner(p) is self:
                del p._muon_opt_owner
        self._opt.close()


_SCRATCH = set()  # scratch directories removed at exit


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
