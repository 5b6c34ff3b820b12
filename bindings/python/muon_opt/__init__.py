"""Python binding of libmuon_opt (ctypes, standard library only).

A thin object layer over the C API of include/muon_opt.h; every rule (validation, routing,
planning, threading) is the library's, and every failing call raises :class:`MuonError` with
the library's status and message. The raw mirror (constants, ctypes structs, the bound CDLL)
is in :mod:`muon_opt._capi`; ``muon_opt._capi.lib()`` gives the CDLL itself.

Host backend, 2 ranks on threads (ctypes releases the GIL during each C call)::

    import threading, muon_opt as mo
    group = mo.HostGroup(2)
    def rank(comm):
        opt = mo.Optimizer(mo.Config(bucket_size=4096), comm)
        w = opt.add_param("fc.weight", (64, 32), dtype=mo.Dtype.F32)
        opt.finalize()
        view = opt.param_view(w)            # view.data / view.grad: memoryviews ('f')
        for _ in range(3):
            opt.zero_grad()
            opt.wait_params(view.bucket)    # forward pre-hook
            view.grad[:] = ...              # backward accumulates into view.grad
            opt.grad_ready(w)
            opt.step(lr=0.02, adam_lr=3e-4)
        opt.close()
    threads = [threading.Thread(target=rank, args=(c,)) for c in group]
    ...
"""

import ctypes
import enum
import json
import os
import uuid
import weakref
from ctypes import POINTER, byref, c_char, c_char_p, c_float, c_int64, c_size_t, c_uint16, c_uint32, c_uint64
from typing import NamedTuple

from . import _capi, _qk_layout
from ._capi import MuonError, lib
from ._capi import constants as _constants

globals().update(_capi.constants())  # every MUON_* constant of the header


def _enum(name, prefix, base=enum.IntEnum):
    members = {k[len(prefix) :]: v for k, v in _capi.constants().items() if k.startswith(prefix)}
    return base(name, members, module=__name__)


Status = _enum("Status", "MUON_STATUS_")
Layout = _enum("Layout", "MUON_LAYOUT_")
Dtype = _enum("Dtype", "MUON_DTYPE_")
Coefficients = _enum("Coefficients", "MUON_COEFFICIENTS_")
NsPrecision = _enum("NsPrecision", "MUON_NS_PRECISION_")
NsMethod = _enum("NsMethod", "MUON_NS_METHOD_")
Ownership = _enum("Ownership", "MUON_OWNERSHIP_")
ScaleMode = _enum("ScaleMode", "MUON_SCALE_")
CommMode = _enum("CommMode", "MUON_COMM_MODE_")
TpMode = _enum("TpMode", "MUON_TP_MODE_")
WeightDecayRule = _enum("WeightDecayRule", "MUON_WEIGHT_DECAY_RULE_")
MuonVariant = _enum("MuonVariant", "MUON_VARIANT_")
ParamSharding = _enum("ParamSharding", "MUON_PARAM_SHARDING_")
Route = _enum("Route", "MUON_ROUTE_")
ParamFlag = _enum("ParamFlag", "MUON_PARAM_FLAG_", enum.IntFlag)
Mxfp8Scales = _enum("Mxfp8Scales", "MUON_MXFP8_SCALES_")
QkKind = _enum("QkKind", "MUON_QK_KIND_")

# The muon_step_args_t fields a step may use in place of the config's (decoupled_lr: in place
# of adam_lr for the params flagged EMBEDDING_OR_OUTPUT, Megatron-LM's --decoupled-lr), with
# their MUON_STEP_OVERRIDE_* bits (the keyword arguments of Optimizer.step and set_step_args).
STEP_OVERRIDES = {
    "muon_momentum": _capi.MUON_STEP_OVERRIDE_MUON_MOMENTUM,
    "adam_beta1": _capi.MUON_STEP_OVERRIDE_ADAM_BETA1,
    "adam_beta2": _capi.MUON_STEP_OVERRIDE_ADAM_BETA2,
    "adam_eps": _capi.MUON_STEP_OVERRIDE_ADAM_EPS,
    "decoupled_lr": _capi.MUON_STEP_OVERRIDE_DECOUPLED_LR,
}


def _status(code):
    try:
        return Status(code)
    except ValueError:
        return int(code)


_capi._status_converter = _status

# Element type of a buffer of each dtype as Python sees it: f32 as 'f'; bf16 as raw uint16
# bits ('H'; e.g. numpy: np.frombuffer(view.data, np.uint16), then view as bfloat16).
_ELEMENT = {_capi.MUON_DTYPE_F32: (c_float, "f"), _capi.MUON_DTYPE_BF16: (c_uint16, "H")}


def version():
    """The library's version code, MAJOR*10000 + MINOR*100 + PATCH."""
    return lib().muon_get_version()


def status_string(status):
    """The library's static description of a status code."""
    return lib().muon_status_string(int(status)).decode()


def cuda_available():
    """Whether a CUDA driver and a device are usable in this process."""
    return bool(lib().muon_cuda_available())


def newton_schulz_host(
    data,
    rows,
    cols,
    coefficient_set=_capi.MUON_COEFFICIENTS_QUINTIC,
    steps=5,
    precision=_capi.MUON_NS_PRECISION_F32,
    method=_capi.MUON_NS_METHOD_STANDARD,
    custom_coefficients=(),
):
    """The library's host Newton–Schulz of a rows×cols row-major f32 buffer, as an optimizer
    with these settings (and the default ``muon_ns_eps``) computes it; returns a new
    ``array('f')``. ``method``: :class:`NsMethod`; ``GRAM`` runs the Gram iteration where it
    applies (``muon_config_t.muon_ns_method``), the standard one elsewhere.
    ``custom_coefficients``: the ``(a, b, c)`` triples of ``Coefficients.CUSTOM``."""
    import array

    src = memoryview(data).cast("B")
    if src.nbytes != rows * cols * 4:
        raise ValueError(f"expected {rows}x{cols} float32 values ({rows * cols * 4} bytes), got {src.nbytes} bytes")
    config = Config(
        muon_coefficient_set=coefficient_set,
        muon_num_ns_steps=steps,
        muon_ns_precision=precision,
        muon_ns_method=method,
        muon_custom_coefficients=custom_coefficients,
    )
    src_arr = (c_float * (rows * cols)).from_buffer_copy(src)
    out = array.array("f", bytes(rows * cols * 4))
    out_arr = (c_float * (rows * cols)).from_buffer(out)
    lib().muon_newton_schulz_host_config(src_arr, out_arr, rows, cols, byref(config.struct))
    del out_arr
    return out


def mxfp8_scale_shape(rows, cols):
    """(rowwise rows, rowwise cols, colwise rows, colwise cols) of the E8M0 scale arrays of a
    [rows, cols] MXFP8 tensor."""
    shapes = (ctypes.c_uint64 * 4)()
    lib().muon_mxfp8_scale_shape(rows, cols, shapes)
    return tuple(shapes)


class Network(NamedTuple):
    """A declared data-parallel ring (``muon_network_t``): the planner chooses compact's group
    window and, under ``Ownership.AUTO``, the ownership by its modelled cost on it
    (docs/design.md §4). nccl-tests gives both figures: the bus bandwidth of a large
    reduce-scatter, the latency of a small one over its n − 1 ring steps."""

    hop_latency_us: float
    bus_bandwidth_gbps: float


class Config:
    """A ``muon_config_t`` holding muon_config_init() defaults; fields are attributes.

    ``Config(bucket_size=4096, muon_layout=Layout.PADDED)``; unknown names raise AttributeError.
    ``network`` and ``expert_network`` read and take a :class:`Network` (or a
    ``(hop_latency_us, bus_bandwidth_gbps)`` pair), or None for undeclared.
    ``muon_custom_coefficients`` reads and takes a list of ``(a, b, c)`` triples, and setting
    it also sets ``muon_custom_coefficient_steps`` (``Config(muon_coefficient_set=
    Coefficients.CUSTOM, muon_custom_coefficients=[(a, b, c), ...])``).
    """

    _FIELDS = dict(_capi.muon_config_t._fields_)

    def __init__(self, **fields):
        object.__setattr__(self, "struct", _capi.muon_config_t())
        lib().muon_config_init(byref(self.struct))
        for name, value in fields.items():
            setattr(self, name, value)

    def __getattr__(self, name):
        if name not in Config._FIELDS:
            raise AttributeError(f"muon_config_t has no field '{name}'")
        value = getattr(self.struct, name)
        if Config._FIELDS[name] is _capi.muon_network_t:
            return Network(value.hop_latency_us, value.bus_bandwidth_gbps) if value.declared else None
        if name == "muon_custom_coefficients":
            steps = min(self.struct.muon_custom_coefficient_steps, _capi.MUON_MAX_CUSTOM_COEFFICIENTS)
            return [tuple(value[3 * k : 3 * k + 3]) for k in range(steps)]
        return value

    def __setattr__(self, name, value):
        ctype = Config._FIELDS.get(name)
        if ctype is None:
            raise AttributeError(f"muon_config_t has no field '{name}'")
        if ctype is _capi.muon_network_t:
            value = _network_struct(value, f"muon_config_t.{name}")
        elif name == "muon_custom_coefficients":
            value = _coefficient_table(value)
            self.struct.muon_custom_coefficient_steps = len(value) // 3
            value = ctype(*value)
        elif ctype is not c_float:
            value = _capi.check_integer(ctype, value, f"muon_config_t.{name}")
        setattr(self.struct, name, value)

    def validate(self):
        """Raises MuonError naming the first invalid field or combination."""
        lib().muon_config_validate(byref(self.struct))

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in _capi.muon_config_t._fields_}

    def __repr__(self):
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"


def _coefficient_table(value):
    """The flat a, b, c values of a list of (a, b, c) triples, at most
    MUON_MAX_CUSTOM_COEFFICIENTS of them (the library checks that they are finite)."""
    field = "muon_config_t.muon_custom_coefficients"
    try:
        triples = [tuple(float(v) for v in triple) for triple in value]
    except (TypeError, ValueError) as e:
        raise TypeError(f"{field}: expected a list of (a, b, c) triples, got {value!r}") from e
    if any(len(t) != 3 for t in triples):
        raise TypeError(f"{field}: expected a list of (a, b, c) triples, got {value!r}")
    if len(triples) > _capi.MUON_MAX_CUSTOM_COEFFICIENTS:
        raise ValueError(f"{field}: {len(triples)} triples is more than {_capi.MUON_MAX_CUSTOM_COEFFICIENTS}")
    return [v for t in triples for v in t]


def _network_struct(value, field):
    """A muon_network_t of a Network, a (hop_latency_us, bus_bandwidth_gbps) pair or None; the
    library checks the figures (finite, latency >= 0, bandwidth > 0) and names the field."""
    if value is None:
        return _capi.muon_network_t()
    try:
        latency, bandwidth = value
        return _capi.muon_network_t(1, 0, float(latency), float(bandwidth))
    except (TypeError, ValueError) as e:
        raise TypeError(f"{field}: expected None or (hop_latency_us, bus_bandwidth_gbps), got {value!r}") from e


class _Owner:
    """A library handle released by ``close()``: on garbage collection (errors dropped) and at
    the end of a ``with`` block."""

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Comm(_Owner):
    """Owner of one ``muon_comm_t``: a host-group rank or a borrowed NCCL communicator."""

    def __init__(self, handle, host=True):
        self._handle = handle  # POINTER(muon_comm_t)
        self.host = host  # host-group rank (host memory) or NCCL (device memory)
        self._users = weakref.WeakSet()  # the _Storage of each optimizer that claimed it
        # The same text on every rank of one HostGroup (None for NCCL): ranks that are threads
        # of one process name a shared scratch directory with it (muon_opt.torch's state_dict).
        self.group_key = None

    def _claim(self, storage, call):
        """Runs ``call()``, which claims this communicator for the optimizer of ``storage``.
        While a closed Optimizer's param view is alive, its library optimizer and so its
        claim live on: a refusal then says so."""
        try:
            call()
        except MuonError as err:
            if err.status != Status.INVALID_STATE or not any(u.closed for u in self._users):
                raise
            raise MuonError(
                err.status,
                err.message + " — here an Optimizer on this Comm was closed, but a param view of it"
                " (a memoryview, or a numpy/torch array made from one) is still alive: it keeps that"
                " optimizer, and its claim on the communicator, until the last view is dropped",
                err.function,
            ) from None
        self._users.add(storage)

    @classmethod
    def from_nccl(cls, nccl_comm_address):
        """Wraps the caller's ncclComm_t (an address; borrowed, must outlive the handle)."""
        out = POINTER(_capi.muon_comm_t)()
        lib().muon_comm_create_nccl(nccl_comm_address, byref(out))
        return cls(out, host=False)

    @property
    def handle(self):
        return self._handle

    @property
    def rank(self):
        r = c_uint32()
        lib().muon_comm_rank(self._handle, byref(r))
        return r.value

    @property
    def size(self):
        n = c_uint32()
        lib().muon_comm_size(self._handle, byref(n))
        return n.value

    def close(self):
        """Destroys the handle (idempotent); after any optimizer created on it."""
        handle, self._handle = self._handle, None
        if handle:
            lib().muon_comm_destroy(handle)



class HostGroup:
    """An in-process group of ``world_size`` ranks (host backend): a sequence of Comm, rank r at
    index r. Use each rank from its own thread."""

    def __init__(self, world_size):
        world_size = _capi.check_integer(c_uint32, world_size, "HostGroup world_size")
        # The library refuses more than MUON_MAX_HOST_GROUP_SIZE before writing any entry.
        raw = (POINTER(_capi.muon_comm_t) * min(world_size, _capi.MUON_MAX_HOST_GROUP_SIZE))()
        lib().muon_host_group_create(world_size, raw)
        self.comms = [Comm(raw[r]) for r in range(world_size)]
        key = uuid.uuid4().hex
        for comm in self.comms:
            comm.group_key = key

    def __len__(self):
        return len(self.comms)

    def __getitem__(self, rank):
        return self.comms[rank]

    def __iter__(self):
        return iter(self.comms)

    def close(self):
        for comm in self.comms:
            comm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StepInfo(NamedTuple):
    """What a step did (``muon_step_info_t``)."""

    skipped: bool
    grad_norm: float
    clip_coef: float
    step: int


class QkClip(NamedTuple):
    """One attention matrix for :meth:`Optimizer.qk_clip` (``muon_qk_clip_t``). ``max_logits``:
    ``num_heads`` floats on the host backend (read during the call), a device address (int) of
    ``num_heads`` float32 on the cuda backend (read by the next step on the optimizer's stream).
    ``num_query_groups`` 0 means ``num_heads`` (no GQA)."""

    param_id: int
    kind: int
    num_heads: int
    head_dim: int
    max_logits: object
    num_query_groups: int = 0
    rope_dim: int = 0
    v_head_dim: int = 0


class ParamView:
    """Where a registered param lives (``muon_param_view_t``).

    ``data`` and ``grad`` are flat memoryviews of the library's storage (format 'f' for f32,
    'H' raw bits for bf16; None for an MXFP8 param's data); ``shape`` is the registered shape.
    For an MXFP8 param, ``mxfp8_{rowwise,colwise}_{data,scales}`` are byte memoryviews (E4M3
    data of mxfp8_rows x mxfp8_cols, E8M0 scales shaped by :func:`mxfp8_scale_shape`), else
    None. Every memoryview, and every buffer made from one, keeps the library's memory alive,
    also past Optimizer.close() (see :meth:`Optimizer.close`). Memoryviews exist on the host
    backend only; on the cuda backend (an NCCL Comm) they are None and ``data_ptr``,
    ``grad_ptr`` and ``raw`` hold the device addresses.
    """

    def __init__(self, storage, raw, shape, dtype, grad_dtype, host):
        self.raw = raw
        self.shape = shape
        self.route = Route(raw.route)
        self.bucket = raw.bucket
        self.owner = raw.owner
        self.offset = raw.offset
        self.numel = raw.numel
        self.data_ptr = raw.data  # addresses (int or None); device pointers on the cuda backend
        self.grad_ptr = raw.grad
        if not host:  # device memory: no memoryviews
            storage = None
        self.data = _memory(storage, raw.data, raw.numel, dtype)
        self.grad = _memory(storage, raw.grad, raw.numel, grad_dtype)
        self.mxfp8_scale_layout = raw.mxfp8_scale_layout
        self.mxfp8_rows = raw.mxfp8_rows
        self.mxfp8_cols = raw.mxfp8_cols
        sizes = {"data": raw.mxfp8_rows * raw.mxfp8_cols}
        if raw.mxfp8_rowwise_data:
            r_rows, r_cols, c_rows, c_cols = mxfp8_scale_shape(raw.mxfp8_rows, raw.mxfp8_cols)
            sizes.update(rowwise_scales=r_rows * r_cols, colwise_scales=c_rows * c_cols)
        for which in ("rowwise", "colwise"):
            for part in ("data", "scales"):
                name = f"mxfp8_{which}_{part}"
                ptr = ctypes.cast(getattr(raw, name), ctypes.c_void_p).value
                size = sizes["data"] if part == "data" else sizes.get(f"{which}_scales", 0)
                setattr(self, name, _memory(storage, ptr, size, None) if ptr else None)

    def __repr__(self):
        return (
            f"ParamView(route={self.route.name}, bucket={self.bucket}, owner={self.owner}, "
            f"offset={self.offset}, numel={self.numel}, shape={self.shape})"
        )


def _memory(storage, address, numel, dtype):
    if not address or storage is None:
        return None
    ctype, fmt = _ELEMENT[dtype] if dtype is not None else (ctypes.c_uint8, "B")
    arr = (ctype * numel).from_address(address)
    # Every memoryview, slice, cast or numpy/torch array made from this view keeps ``arr``
    # alive, and ``arr`` keeps the library's memory alive (see _Storage).
    arr._muon_storage = storage
    return memoryview(arr).cast("B").cast(fmt)


class _Storage:
    """The C optimizer handle behind an Optimizer and behind every buffer made from its param
    views. It is destroyed when the last of them is gone: ``Optimizer.close()`` drops the
    optimizer's reference, so the memory is freed at once unless a view (or an array made from
    one) is still alive, and then when that goes."""

    def __init__(self, handle):
        self.handle = handle
        self.closed = False  # Optimizer.close() ran; views may keep this alive

    def __del__(self):
        try:
            lib().muon_optimizer_destroy(self.handle)
        except Exception:
            pass


class Optimizer(_Owner):
    """Owner of one ``muon_optimizer_t`` (one per rank; one thread at a time).

    Methods map 1:1 to the ``muon_optimizer_*`` functions. ``stream`` is a cudaStream_t address
    (None on the host backend and for the legacy default stream).
    """

    def __init__(self, config, comm, stream=None):
        self._handle = None
        config = Config() if config is None else config
        out = POINTER(_capi.muon_optimizer_t)()
        storage = _Storage(out)
        create = lib().muon_optimizer_create
        comm._claim(storage, lambda: create(byref(config.struct), comm.handle, stream, byref(out)))
        self._handle = out
        self._storage = storage
        self._comm = comm  # the communicator must outlive the optimizer
        self._grad_dtype = config.grad_dtype
        self._params = []  # (shape, dtype) per id

    @property
    def handle(self):
        return self._handle

    def add_param(
        self,
        name,
        shape,
        *,
        dtype=None,
        flags=0,
        tie_group=0,
        split_sizes=None,
        split_groups=None,
        init=None,
        init_dtype=None,
        lr_scale=None,
        wd_scale=None,
    ):
        """Registers a param (forward order, before finalize); returns its id.

        ``init``: initial values as any buffer (array('f'), bytes, numpy, memoryview); its
        dtype is ``init_dtype`` or, if None, taken from the buffer's format ('f' = F32,
        'H' = BF16 bits). ``split_groups``: how many times ``split_sizes`` repeats along the
        rows (Megatron's fused QKV: ``split_sizes=(q, k, v)``, ``split_groups`` = query groups). On the cuda backend ``init`` is a device address (an int) and
        ``init_dtype`` is required. ``dtype`` (the model dtype) defaults to the library's (bf16).
        """
        d = _capi.muon_param_desc_t()
        lib().muon_param_desc_init(byref(d))
        if not isinstance(name, str):
            raise TypeError(f"add_param: name must be a str, got {type(name).__name__}")
        name_bytes = _capi.check_text(name.encode(), f"add_param name {name!r}")
        d.name = name_bytes
        shape = tuple(_capi.check_integer(c_int64, s, f"add_param '{name}' shape[{i}]") for i, s in enumerate(shape))
        d.ndim = len(shape)  # the library rejects a bad ndim; only MUON_MAX_DIMS entries fit
        for i, s in enumerate(shape[: _capi.MUON_MAX_DIMS]):
            d.shape[i] = s
        if dtype is not None:
            d.dtype = _capi.check_integer(c_uint32, dtype, f"add_param '{name}' dtype")
        d.flags = _capi.check_integer(c_uint32, flags, f"add_param '{name}' flags")
        d.tie_group = _capi.check_integer(c_uint32, tie_group, f"add_param '{name}' tie_group")
        splits = None
        if split_sizes is not None:
            split_sizes = [
                _capi.check_integer(c_int64, v, f"add_param '{name}' split_sizes[{i}]") for i, v in enumerate(split_sizes)
            ]
            splits = (c_int64 * len(split_sizes))(*split_sizes)
            d.num_splits = len(split_sizes)
            d.split_sizes = ctypes.cast(splits, POINTER(c_int64))
        if split_groups is not None:
            d.num_split_groups = _capi.check_integer(c_uint32, split_groups, f"add_param '{name}' split_groups")
        keep = None
        if isinstance(init, int):  # an address (device memory on the cuda backend)
            if init_dtype is None:
                raise ValueError("init: an address needs init_dtype")
            d.init_data = _capi.check_integer(c_uint64, init, f"add_param '{name}' init address")
            d.init_dtype = _capi.check_integer(c_uint32, init_dtype, f"add_param '{name}' init_dtype")
        elif init is not None:
            mv = memoryview(init)
            if init_dtype is None:
                fmt = mv.format.lstrip("@=<")
                init_dtype = {"f": _capi.MUON_DTYPE_F32, "H": _capi.MUON_DTYPE_BF16}.get(fmt)
                if init_dtype is None:
                    raise ValueError(f"init: cannot infer init_dtype from buffer format '{mv.format}'; pass init_dtype")
            if init_dtype not in _ELEMENT:
                raise ValueError(f"init_dtype: {init_dtype} is not a MUON_DTYPE_* value")
            numel = 1
            for s in shape:
                numel *= s
            need = numel * ctypes.sizeof(_ELEMENT[init_dtype][0])
            if mv.nbytes != need:
                raise ValueError(
                    f"init: param '{name}' of shape {shape} needs {need} bytes, the buffer has {mv.nbytes}"
                )
            raw = mv.cast("B") if mv.c_contiguous else memoryview(mv.tobytes())
            keep = (c_char * need).from_buffer_copy(raw) if raw.readonly else (c_char * need).from_buffer(raw)
            d.init_data = ctypes.cast(keep, ctypes.c_void_p)
            d.init_dtype = _capi.check_integer(c_uint32, init_dtype, f"add_param '{name}' init_dtype")
        if lr_scale is not None:
            d.lr_scale = lr_scale
        if wd_scale is not None:
            d.wd_scale = wd_scale
        pid = c_uint32()
        lib().muon_optimizer_add_param(self._handle, byref(d), byref(pid))
        del keep, splits, name_bytes
        self._params.append((shape, d.dtype))
        return pid.value

    def set_norm_group(self, group):
        """Makes the gradient norm, clip and skip global over ``group`` (a :class:`Comm`
        spanning the data-parallel group, e.g. every rank of a tensor/pipeline-parallel job);
        before :meth:`finalize`. Flag copies another rank counts with
        ``ParamFlag.NORM_REPLICA``."""
        group._claim(self._storage, lambda: lib().muon_optimizer_set_norm_group(self._handle, group.handle))

    def set_tp_group(self, group):
        """The tensor-parallel group (a :class:`Comm`) over which ``TpMode.DUPLICATED`` gathers
        the matrices flagged ``ParamFlag.TP_SHARD_ROWS`` / ``TP_SHARD_COLS``; before
        :meth:`finalize`."""
        group._claim(self._storage, lambda: lib().muon_optimizer_set_tp_group(self._handle, group.handle))

    def param_route(self, param_id):
        route = c_uint32()
        lib().muon_optimizer_param_route(self._handle, param_id, byref(route))
        return Route(route.value)

    def set_param_scales(self, param_id, lr_scale, wd_scale):
        """After :meth:`finalize`: param ``param_id``'s multipliers of its route's learning rate
        and weight decay for the later steps (finite, >= 0; the same change on every rank)."""
        lib().muon_optimizer_set_param_scales(self._handle, param_id, lr_scale, wd_scale)

    def finalize(self):
        """Collective: plans the layout and checks every rank planned the same."""
        lib().muon_optimizer_finalize(self._handle)

    def num_buckets(self):
        """The buckets of the finalized plan: wait_params takes 0 .. num_buckets() - 1."""
        count = ctypes.c_uint32()
        lib().muon_optimizer_num_buckets(self._handle, byref(count))
        return count.value

    def plan_json(self):
        """The plan and its report as a JSON string (``json.loads`` it for a dict)."""
        need = c_size_t()
        try:
            lib().muon_optimizer_plan_json(self._handle, None, 0, byref(need))
        except MuonError as e:
            if e.status != Status.BUFFER_TOO_SMALL:
                raise
        buf = ctypes.create_string_buffer(need.value)
        lib().muon_optimizer_plan_json(self._handle, buf, need.value, byref(need))
        return buf.value.decode()

    def plan(self):
        """The plan as a dict."""
        return json.loads(self.plan_json())

    def param_view(self, param_id):
        raw = _capi.muon_param_view_t()
        raw.struct_size = ctypes.sizeof(raw)
        lib().muon_optimizer_param_view(self._handle, param_id, byref(raw))
        shape, dtype = self._params[param_id]
        return ParamView(self._storage, raw, shape, dtype, self._grad_dtype, self._comm.host)

    def zero_grad(self):
        lib().muon_optimizer_zero_grad(self._handle)

    def wait_params(self, bucket):
        """Forward pre-hook: before the first use of a param of ``bucket`` (with sharded params
        it gathers the bucket first unless it is gathered)."""
        lib().muon_optimizer_wait_params(self._handle, bucket)

    def gather_params(self, bucket):
        """Sharded params: issue the gather of ``bucket`` ahead of its use (prefetch)."""
        lib().muon_optimizer_gather_params(self._handle, bucket)

    def release_params(self, bucket):
        """Sharded params: end ``bucket``'s gathered window after its last use."""
        lib().muon_optimizer_release_params(self._handle, bucket)

    def grad_ready(self, param_id):
        """Backward hook: the param's gradient is complete for this iteration."""
        lib().muon_optimizer_grad_ready(self._handle, param_id)

    @staticmethod
    def _step_args(lr, adam_lr, weight_decay, adam_weight_decay, overrides=None):
        """A ``muon_step_args_t``; ``overrides`` maps ``muon_momentum``, ``adam_beta1``,
        ``adam_beta2``, ``adam_eps`` to a value (None: the config's) and ``decoupled_lr`` to the
        embedding and output params' learning rate (None: ``adam_lr``)."""
        args = _capi.muon_step_args_t(
            ctypes.sizeof(_capi.muon_step_args_t), lr, weight_decay, adam_lr, adam_weight_decay
        )
        overrides = dict(overrides or {})
        unknown = set(overrides) - set(STEP_OVERRIDES)
        if unknown:
            raise TypeError(f"step args: unknown overrides {sorted(unknown)}; they are {list(STEP_OVERRIDES)}")
        for name, value in overrides.items():
            if value is not None:
                args.overrides |= STEP_OVERRIDES[name]
                setattr(args, name, value)
        return args

    def set_step_args(self, *, lr, adam_lr, weight_decay=0.0, adam_weight_decay=0.0, **overrides):
        """The arguments of the next steps called without ``lr``: copied to the device in
        stream order, never waits (the form a CUDA-graph-captured step replays with). The
        overrides of :meth:`step` are set with them."""
        args = self._step_args(lr, adam_lr, weight_decay, adam_weight_decay, overrides)
        lib().muon_optimizer_set_step_args(self._handle, byref(args))

    def step(self, *, lr=None, adam_lr=None, weight_decay=0.0, adam_weight_decay=0.0, wait=True, **overrides):
        """One optimizer step (Muon lr and decay, AdamW lr and decay); returns StepInfo. Without
        ``lr`` and ``adam_lr`` the step uses the arguments of :meth:`set_step_args` and copies
        nothing from the host. With ``wait=False`` the step is only enqueued (it never waits
        for the device) and returns None; :meth:`step_info` reads what it did later.

        ``muon_momentum``, ``adam_beta1``, ``adam_beta2``, ``adam_eps`` (keywords, default None:
        the config's) override the config for this step only (a scheduler's values; AdamW's
        bias corrections are ``1 - beta**t`` with this step's beta, as torch.optim.AdamW's);
        a value out of range raises MuonError (``OUT_OF_RANGE``) naming it, and nothing changes.
        ``decoupled_lr`` (default None: ``adam_lr``) is the learning rate of the params flagged
        ``ParamFlag.EMBEDDING_OR_OUTPUT`` for this step, Megatron-LM's ``--decoupled-lr`` (the
        caller schedules it like ``lr``, down to ``--decoupled-min-lr``)."""
        if (lr is None) != (adam_lr is None):
            raise ValueError("step: give both lr and adam_lr, or neither to use set_step_args")
        if lr is None:
            if weight_decay or adam_weight_decay or any(v is not None for v in overrides.values()):
                raise ValueError("step: weight decays or overrides without lr; pass them to set_step_args")
            args = None
        else:
            args = byref(self._step_args(lr, adam_lr, weight_decay, adam_weight_decay, overrides))
        if not wait:
            lib().muon_optimizer_step(self._handle, args, None)
            return None
        info = _capi.muon_step_info_t()
        info.struct_size = ctypes.sizeof(info)
        lib().muon_optimizer_step(self._handle, args, byref(info))
        return StepInfo(bool(info.skipped), info.grad_norm, info.clip_coef, info.step)

    def qk_clip(self, clips, *, threshold, alpha=0.5):
        """QK-clip (Kimi K2's MuonClip) of :class:`QkClip` attention matrices by the next step:
        per head group whose max logit S exceeds ``threshold``, eta = threshold / S, query rows
        × eta**alpha, key rows × eta**(1 - alpha) (MLA rotary query rows × eta), applied to the
        owner's master and carried to every copy by the step. Every rank calls it with the same
        params before :meth:`step`. Enqueues nothing, never waits. A host list of maxima whose
        length is not ``num_heads`` is refused (``ValueError``); a device address cannot be
        checked here: it must hold ``num_heads`` float32."""
        clips = list(clips)
        for i, c in enumerate(clips):
            if not isinstance(c.max_logits, int):
                _qk_layout.check_maxima_count(f"qk_clip clips[{i}] (param {c.param_id})", c.num_heads, len(c.max_logits))
        structs = (_capi.muon_qk_clip_t * max(len(clips), 1))()
        keep = []
        for s, c in zip(structs, clips):
            lib().muon_qk_clip_init(byref(s))
            s.param_id, s.kind, s.num_heads, s.head_dim = c.param_id, c.kind, c.num_heads, c.head_dim
            s.num_query_groups = c.num_query_groups or c.num_heads
            s.rope_dim, s.v_head_dim = c.rope_dim, c.v_head_dim
            if isinstance(c.max_logits, int):
                s.max_logits = ctypes.cast(ctypes.c_void_p(c.max_logits), POINTER(c_float))
            else:
                values = (c_float * len(c.max_logits))(*c.max_logits)
                keep.append(values)
                s.max_logits = ctypes.cast(values, POINTER(c_float))
        lib().muon_optimizer_qk_clip(self._handle, structs, len(clips), threshold, alpha)

    def step_info(self):
        """What the last step did (waits for the device on the cuda backend)."""
        info = _capi.muon_step_info_t()
        info.struct_size = ctypes.sizeof(info)
        lib().muon_optimizer_step_info(self._handle, byref(info))
        return StepInfo(bool(info.skipped), info.grad_norm, info.clip_coef, info.step)

    def synchronize(self):
        lib().muon_optimizer_synchronize(self._handle)

    def join(self):
        """Orders the caller's stream after the library's queued communication (no host wait);
        the last call of an iteration captured in a CUDA graph."""
        lib().muon_optimizer_join(self._handle)

    def save(self, directory):
        """Collective: every rank saves its state into checkpoint ``directory`` (same path on
        every rank; replaced atomically). Host-synchronizing."""
        lib().muon_optimizer_save(self._handle, os.fsencode(directory))

    def load(self, directory):
        """Collective: every rank loads checkpoint ``directory`` (any dp size and layout) and
        re-synchronizes its params; on failure nothing changed. Between steps."""
        lib().muon_optimizer_load(self._handle, os.fsencode(directory))

    def load_union(self, directories):
        """Collective: loads every registered param from the one of ``directories`` that holds
        it (e.g. the expert checkpoints of another expert-parallel split); params this
        optimizer does not register are left out. Same step and numerics in all of them."""
        paths = [os.fsencode(d) for d in directories]
        array = (c_char_p * len(paths))(*paths)
        lib().muon_optimizer_load_union(self._handle, ctypes.cast(array, POINTER(POINTER(c_char))), len(paths))

    def close(self):
        """Closes the optimizer (idempotent): every later call on it raises. The library's
        memory is freed now, or, while a param view's buffer (a memoryview, a slice of one, a
        numpy or torch array made from one) is still alive, when the last of them is dropped —
        such a buffer never reads freed memory. Until then that optimizer also keeps its
        communicators claimed: creating another optimizer on them is refused, and the message
        says that a live view holds them."""
        if self._storage is not None:
            self._storage.closed = True
        self._handle = None
        self._storage = None


def step_shared(optimizers, args=None):
    """One step of several optimizers of this rank with one gradient norm, clip coefficient and
    skip decision (``muon_optimizers_step``; e.g. a dense and an expert optimizer). ``args`` is
    None (each uses its :meth:`Optimizer.set_step_args`) or one dict per optimizer with
    ``lr``, ``adam_lr`` and optionally ``weight_decay``, ``adam_weight_decay`` and the
    overrides of :meth:`Optimizer.step` (``muon_momentum``, ``adam_beta1``, …). Every rank
    passes its optimizers in the same order. Enqueues only; :meth:`Optimizer.step_info` of any
    of them reads what the step did."""
    optimizers = list(optimizers)
    handles = (_capi._opt * len(optimizers))(*[o._handle for o in optimizers])
    array = None
    if args is not None:
        args = list(args)
        if len(args) != len(optimizers):
            raise ValueError(f"step_shared: {len(args)} args for {len(optimizers)} optimizers")
        array = (_capi.muon_step_args_t * len(args))(
            *[
                Optimizer._step_args(
                    a["lr"], a["adam_lr"], a.get("weight_decay", 0.0), a.get("adam_weight_decay", 0.0),
                    {k: v for k, v in a.items() if k not in ("lr", "adam_lr", "weight_decay", "adam_weight_decay")},
                )
                for a in args
            ]
        )
    lib().muon_optimizers_step(handles, len(optimizers), array)


__all__ = [
    "MuonError",
    "Status",
    "Layout",
    "Dtype",
    "Coefficients",
    "NsPrecision",
    "NsMethod",
    "Ownership",
    "Network",
    "ScaleMode",
    "CommMode",
    "TpMode",
    "WeightDecayRule",
    "MuonVariant",
    "ParamSharding",
    "Route",
    "ParamFlag",
    "Mxfp8Scales",
    "Config",
    "Comm",
    "HostGroup",
    "Optimizer",
    "ParamView",
    "StepInfo",
    "version",
    "status_string",
    "cuda_available",
    "newton_schulz_host",
    "mxfp8_scale_shape",
    "step_shared",
    "STEP_OVERRIDES",
    "lib",
] + sorted(_constants())
