"""The ctypes mirror of include/muon_opt.h: constants, structs and function prototypes.

Hand-written, and checked against the header by tests/test_header_mirror.py: every
``#define``/enum constant, every struct's field list (names, order, types), every function's
signature, and every struct's size and field offsets as the C compiler lays them out. A header
change this file does not follow fails that test. Keep names exactly as in the header.

The library itself is loaded on first use by :func:`lib` (not at import), from the places
:func:`library_candidates` lists. Every bound function checks its integer, address and string
arguments against its prototype first (ctypes would wrap and truncate them silently).
"""

import ctypes
import operator
import os
import sys
import threading
from ctypes import (
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

# --- #define constants (same names and values as the header) -------------------------------

MUON_VERSION_MAJOR = 0
MUON_VERSION_MINOR = 1
MUON_VERSION_PATCH = 0
MUON_VERSION_CODE = 100

MUON_MAX_HOST_GROUP_SIZE = 4096

MUON_LAYOUT_COMPACT = 0
MUON_LAYOUT_PADDED = 1
MUON_LAYOUT_ALLREDUCE = 2
MUON_LAYOUT_COMPACT_ROOTED = 3

MUON_DTYPE_F32 = 0
MUON_DTYPE_BF16 = 1

MUON_COEFFICIENTS_QUINTIC = 0
MUON_COEFFICIENTS_SIMPLE = 1
MUON_COEFFICIENTS_POLAR_EXPRESS = 2
MUON_COEFFICIENTS_QUINTIC_CYCLIC = 3
MUON_COEFFICIENTS_CANS = 4
MUON_COEFFICIENTS_AOL = 5
MUON_COEFFICIENTS_CUBIC5 = 6
MUON_COEFFICIENTS_DEEPSEEK_V4 = 7
MUON_COEFFICIENTS_POLAR_EXPRESS_5 = 8
MUON_COEFFICIENTS_CUSTOM = 9
MUON_MAX_CUSTOM_COEFFICIENTS = 16

MUON_NS_PRECISION_BF16 = 0
MUON_NS_PRECISION_F32 = 1
MUON_NS_PRECISION_BF16_ITERATE = 2

MUON_NS_METHOD_STANDARD = 0
MUON_NS_METHOD_GRAM = 1
MUON_OWNERSHIP_BALANCED = 0
MUON_OWNERSHIP_CONTIGUOUS = 1
MUON_OWNERSHIP_AUTO = 2

MUON_SCALE_SPECTRAL = 0
MUON_SCALE_SHAPE_SCALING = 1
MUON_SCALE_UNIT_RMS_NORM = 2
MUON_TP_MODE_BLOCKWISE = 0
MUON_TP_MODE_DUPLICATED = 1
MUON_TP_MODE_DISTRIBUTED = 2

MUON_WEIGHT_DECAY_RULE_MEGATRON = 0
MUON_WEIGHT_DECAY_RULE_MEGATRON_QK_LAYERNORM = 1
MUON_WEIGHT_DECAY_RULE_FLAGGED = 2

MUON_VARIANT_STANDARD = 0
MUON_VARIANT_NORMUON = 1
MUON_VARIANT_ADAMUON = 2
MUON_PARAM_SHARDING_REPLICATED = 0
MUON_PARAM_SHARDING_SHARDED = 1

MUON_COMM_MODE_FROM_ENV = 0
MUON_COMM_MODE_EAGER = 1
MUON_COMM_MODE_LAZY = 2

MUON_ROUTE_MUON = 0
MUON_ROUTE_ADAMW = 1

MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT = 1 << 0
MUON_PARAM_FLAG_NO_MUON = 1 << 1
MUON_PARAM_FLAG_EXPERT_STACK = 1 << 2
MUON_PARAM_FLAG_MXFP8 = 1 << 3
MUON_PARAM_FLAG_NO_WEIGHT_DECAY = 1 << 4
MUON_PARAM_FLAG_ALLOW_VOCAB_DIM = 1 << 5
MUON_PARAM_FLAG_NORM_REPLICA = 1 << 6
MUON_PARAM_FLAG_TP_SHARD_ROWS = 1 << 7
MUON_PARAM_FLAG_TP_SHARD_COLS = 1 << 8
MUON_PARAM_FLAG_TP_WHOLE_GROUPS = 1 << 9
MUON_PARAM_FLAG_WEIGHT_DECAY = 1 << 10
MUON_PARAM_FLAG_TP_WHOLE_COMPONENTS = 1 << 11

MUON_QK_KIND_FUSED_QKV = 1
MUON_QK_KIND_QUERY = 2
MUON_QK_KIND_KEY = 3
MUON_QK_KIND_MLA_QUERY = 4
MUON_QK_KIND_MLA_KEY_VALUE = 5

MUON_STEP_OVERRIDE_MUON_MOMENTUM = 1 << 0
MUON_STEP_OVERRIDE_ADAM_BETA1 = 1 << 1
MUON_STEP_OVERRIDE_ADAM_BETA2 = 1 << 2
MUON_STEP_OVERRIDE_ADAM_EPS = 1 << 3
MUON_STEP_OVERRIDE_DECOUPLED_LR = 1 << 4

MUON_MXFP8_SCALES_COMPACT = 0
MUON_MXFP8_SCALES_SWIZZLED = 1

MUON_MAX_NS_STEPS = 100
MUON_DEFAULT_COLLECTIVE_TIMEOUT_MS = 300000
MUON_MAX_DIMS = 4

# --- enum muon_status_t ----------------------------------------------------------------------

MUON_STATUS_SUCCESS = 0
MUON_STATUS_NULL_ARGUMENT = 100
MUON_STATUS_INVALID_ARGUMENT = 101
MUON_STATUS_INVALID_HANDLE = 102
MUON_STATUS_INVALID_STATE = 103
MUON_STATUS_ABI_MISMATCH = 104
MUON_STATUS_INVALID_ENUM_VALUE = 105
MUON_STATUS_OUT_OF_RANGE = 106
MUON_STATUS_INCOMPATIBLE_OPTIONS = 107
MUON_STATUS_BUFFER_TOO_SMALL = 108
MUON_STATUS_INVALID_PARAM = 109
MUON_STATUS_DUPLICATE_NAME = 110
MUON_STATUS_ROUTING_CONFLICT = 111
MUON_STATUS_CUDA_UNAVAILABLE = 200
MUON_STATUS_CUDA_NO_DEVICE = 201
MUON_STATUS_CUDA_ERROR = 202
MUON_STATUS_NVRTC_UNAVAILABLE = 203
MUON_STATUS_KERNEL_COMPILE_FAILED = 204
MUON_STATUS_NCCL_UNAVAILABLE = 300
MUON_STATUS_NCCL_ERROR = 301
MUON_STATUS_COMM_MISMATCH = 302
MUON_STATUS_OUT_OF_MEMORY = 400
MUON_STATUS_COMM_TIMEOUT = 500
MUON_STATUS_COMM_BROKEN = 501
MUON_STATUS_PLAN_MISMATCH = 502
MUON_STATUS_IO_ERROR = 600
MUON_STATUS_CHECKPOINT_CORRUPT = 601
MUON_STATUS_CHECKPOINT_MISMATCH = 602
MUON_STATUS_CHECKPOINT_VERSION = 603
MUON_STATUS_UNSUPPORTED = 700
MUON_STATUS_INTERNAL = 900
MUON_STATUS_PANIC = 901


class muon_status_t(c_uint32):
    """uint32_t in C (an enum with a uint32_t underlying type in C++). A subclass, so ctypes
    hands the raw result to the errcheck of the status-returning functions (and only them)."""


def constants():
    """Every mirrored header constant, name -> value."""
    return {k: v for k, v in globals().items() if k.startswith("MUON_") and isinstance(v, int)}


# --- opaque handles --------------------------------------------------------------------------


class muon_comm_t(Structure):
    """Opaque: one rank of a host group or a borrowed NCCL communicator."""


class muon_optimizer_t(Structure):
    """Opaque optimizer handle (one per rank)."""


# struct CUstream_st * (cudaStream_t) and struct ncclComm * (ncclComm_t) are passed as
# c_void_p, so an address from any framework (an int) or None works.

# --- structs ---------------------------------------------------------------------------------


class muon_network_t(Structure):
    _fields_ = [
        ("declared", c_uint32),
        ("reserved", c_uint32),
        ("hop_latency_us", c_double),
        ("bus_bandwidth_gbps", c_double),
    ]


class muon_config_t(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("bucket_size", c_uint64),
        ("muon_layout", c_uint32),
        ("overlap_grad_reduce", c_uint32),
        ("overlap_param_gather", c_uint32),
        ("grad_dtype", c_uint32),
        ("muon_momentum", c_float),
        ("muon_nesterov", c_uint32),
        ("muon_coefficient_set", c_uint32),
        ("muon_num_ns_steps", c_uint32),
        ("muon_ns_precision", c_uint32),
        ("muon_scale_mode", c_uint32),
        ("muon_extra_scale_factor", c_float),
        ("adam_beta1", c_float),
        ("adam_beta2", c_float),
        ("adam_eps", c_float),
        ("clip_grad", c_float),
        ("mxfp8_param_gather", c_uint32),
        ("mxfp8_swizzled_scales", c_uint32),
        ("vocab_size", c_uint64),
        ("collective_timeout_ms", c_uint32),
        ("host_comm_mode", c_uint32),
        ("host_threads", c_uint32),
        ("muon_tp_mode", c_uint32),
        ("muon_ns_eps", c_float),
        ("reserved", c_uint32),
        ("muon_ns_method", c_uint32),
        ("reserved2", c_uint32),
        ("muon_ownership", c_uint32),
        ("reserved3", c_uint32),
        ("weight_decay_rule", c_uint32),
        ("network", muon_network_t),
        ("expert_network", muon_network_t),
        ("muon_variant", c_uint32),
        ("adaptive_muon_beta2", c_float),
        ("adaptive_muon_eps", c_float),
        ("reserved4", c_uint32),
        ("param_sharding", c_uint32),
        ("reshard_after_forward", c_uint32),
        ("param_prefetch_buckets", c_uint32),
        ("reserved5", c_uint32),
        ("muon_custom_coefficient_steps", c_uint32),
        ("muon_custom_coefficients", c_float * (3 * MUON_MAX_CUSTOM_COEFFICIENTS)),
        ("reserved6", c_uint32),
        ("cautious_weight_decay", c_uint32),
        ("muon_momentum_dtype", c_uint32),
    ]


class muon_step_args_t(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("lr", c_float),
        ("weight_decay", c_float),
        ("adam_lr", c_float),
        ("adam_weight_decay", c_float),
        ("overrides", c_uint32),
        ("muon_momentum", c_float),
        ("adam_beta1", c_float),
        ("adam_beta2", c_float),
        ("adam_eps", c_float),
        ("decoupled_lr", c_float),
    ]


class muon_step_info_t(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("skipped", c_uint32),
        ("grad_norm", c_double),
        ("clip_coef", c_float),
        ("reserved", c_uint32),
        ("step", c_uint64),
    ]


class muon_param_desc_t(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("ndim", c_uint32),
        ("name", c_char_p),
        ("shape", c_int64 * MUON_MAX_DIMS),
        ("dtype", c_uint32),
        ("flags", c_uint32),
        ("tie_group", c_uint32),
        ("num_splits", c_uint32),
        ("split_sizes", POINTER(c_int64)),
        ("init_data", c_void_p),
        ("init_dtype", c_uint32),
        ("lr_scale", c_float),
        ("wd_scale", c_float),
        ("num_split_groups", c_uint32),
    ]


class muon_param_view_t(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("route", c_uint32),
        ("bucket", c_uint32),
        ("owner", c_int32),
        ("offset", c_uint64),
        ("numel", c_uint64),
        ("data", c_void_p),
        ("grad", c_void_p),
        ("mxfp8_rowwise_data", POINTER(c_uint8)),
        ("mxfp8_rowwise_scales", POINTER(c_uint8)),
        ("mxfp8_colwise_data", POINTER(c_uint8)),
        ("mxfp8_colwise_scales", POINTER(c_uint8)),
        ("mxfp8_scale_layout", c_uint32),
        ("mxfp8_rows", c_uint64),
        ("mxfp8_cols", c_uint64),
        ("dtype", c_uint32),
        ("grad_dtype", c_uint32),
    ]


class muon_qk_clip_t(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("param_id", c_uint32),
        ("kind", c_uint32),
        ("num_heads", c_uint32),
        ("num_query_groups", c_uint32),
        ("head_dim", c_uint32),
        ("rope_dim", c_uint32),
        ("v_head_dim", c_uint32),
        ("max_logits", POINTER(c_float)),
    ]


STRUCTS = {
    cls.__name__: cls
    for cls in (
        muon_network_t,
        muon_config_t,
        muon_step_args_t,
        muon_step_info_t,
        muon_param_desc_t,
        muon_param_view_t,
        muon_qk_clip_t,
    )
}

# --- functions: name -> (restype, argtypes) ---------------------------------------------------

_opt = POINTER(muon_optimizer_t)
_comm = POINTER(muon_comm_t)

PROTOTYPES = {
    "muon_host_group_create": (muon_status_t, [c_uint32, POINTER(_comm)]),
    "muon_comm_create_nccl": (muon_status_t, [c_void_p, POINTER(_comm)]),
    "muon_comm_rank": (muon_status_t, [_comm, POINTER(c_uint32)]),
    "muon_comm_size": (muon_status_t, [_comm, POINTER(c_uint32)]),
    "muon_comm_destroy": (muon_status_t, [_comm]),
    "muon_cuda_available": (c_bool, []),
    "muon_config_init": (None, [POINTER(muon_config_t)]),
    "muon_config_validate": (muon_status_t, [POINTER(muon_config_t)]),
    "muon_optimizer_zero_grad": (muon_status_t, [_opt]),
    "muon_optimizer_wait_params": (muon_status_t, [_opt, c_uint32]),
    "muon_optimizer_gather_params": (muon_status_t, [_opt, c_uint32]),
    "muon_optimizer_release_params": (muon_status_t, [_opt, c_uint32]),
    "muon_optimizer_grad_ready": (muon_status_t, [_opt, c_uint32]),
    "muon_optimizer_step": (muon_status_t, [_opt, POINTER(muon_step_args_t), POINTER(muon_step_info_t)]),
    "muon_optimizer_step_info": (muon_status_t, [_opt, POINTER(muon_step_info_t)]),
    "muon_optimizer_set_step_args": (muon_status_t, [_opt, POINTER(muon_step_args_t)]),
    "muon_optimizer_set_tp_group": (muon_status_t, [_opt, _comm]),
    "muon_qk_clip_init": (None, [POINTER(muon_qk_clip_t)]),
    "muon_optimizer_qk_clip": (muon_status_t, [_opt, POINTER(muon_qk_clip_t), c_size_t, c_float, c_float]),
    "muon_optimizers_step": (muon_status_t, [POINTER(_opt), c_size_t, POINTER(muon_step_args_t)]),
    "muon_optimizer_synchronize": (muon_status_t, [_opt]),
    "muon_optimizer_join": (muon_status_t, [_opt]),
    "muon_newton_schulz_host": (
        muon_status_t,
        [POINTER(c_float), POINTER(c_float), c_uint32, c_uint32, c_uint32, c_uint32, c_uint32],
    ),
    "muon_newton_schulz_host_config": (
        muon_status_t,
        [POINTER(c_float), POINTER(c_float), c_uint32, c_uint32, POINTER(muon_config_t)],
    ),
    "muon_mxfp8_scale_shape": (muon_status_t, [c_uint64, c_uint64, POINTER(c_uint64)]),
    "muon_mxfp8_quantize_host": (
        muon_status_t,
        [c_void_p, c_uint32, c_uint64, c_uint64, c_uint32] + [POINTER(c_uint8)] * 4,
    ),
    "muon_optimizer_create": (muon_status_t, [POINTER(muon_config_t), _comm, c_void_p, POINTER(_opt)]),
    "muon_optimizer_add_param": (muon_status_t, [_opt, POINTER(muon_param_desc_t), POINTER(c_uint32)]),
    "muon_optimizer_set_norm_group": (muon_status_t, [_opt, _comm]),
    "muon_optimizer_param_route": (muon_status_t, [_opt, c_uint32, POINTER(c_uint32)]),
    "muon_optimizer_set_param_scales": (muon_status_t, [_opt, c_uint32, c_float, c_float]),
    "muon_optimizer_finalize": (muon_status_t, [_opt]),
    "muon_optimizer_num_buckets": (muon_status_t, [_opt, POINTER(c_uint32)]),
    "muon_optimizer_plan_json": (muon_status_t, [_opt, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "muon_optimizer_param_view": (muon_status_t, [_opt, c_uint32, POINTER(muon_param_view_t)]),
    "muon_optimizer_destroy": (muon_status_t, [_opt]),
    "muon_param_desc_init": (None, [POINTER(muon_param_desc_t)]),
    "muon_status_string": (c_char_p, [c_uint32]),
    "muon_last_error_message": (c_char_p, []),
    "muon_get_version": (c_uint32, []),
    "muon_optimizer_save": (muon_status_t, [_opt, c_char_p]),
    "muon_optimizer_load": (muon_status_t, [_opt, c_char_p]),
    "muon_optimizer_load_union": (muon_status_t, [_opt, POINTER(POINTER(c_char)), c_size_t]),
}

# --- errors and loading ---------------------------------------------------------------------


class MuonError(Exception):
    """A ``muon_*`` call returned a status other than MUON_STATUS_SUCCESS.

    ``status`` is the code (a :class:`muon_opt.Status` member when the code is known),
    ``message`` the library's muon_last_error_message() of the failing call, ``function`` the
    C function's name.
    """

    def __init__(self, status, message, function=""):
        self.status = _status_enum(status)
        self.message = message
        self.function = function
        name = getattr(self.status, "name", "UNKNOWN")
        super().__init__(f"MUON_STATUS_{name} ({int(status)}): {message}")


def _status_enum(code):
    # Set by the package once its enums exist; plain ints until then.
    conv = _status_converter
    return conv(code) if conv is not None else int(code)


_status_converter = None


_lock = threading.Lock()
_lib = None
LIBRARY_NAME = "libmuon_opt.so"
# The soname (scripts/install.sh): before 1.0 every minor version may change the ABI.
SONAME = f"{LIBRARY_NAME}.{MUON_VERSION_MAJOR or f'0.{MUON_VERSION_MINOR}'}"


def library_candidates():
    """The libraries tried, in order, by :func:`lib`: ``$MUON_OPT_LIB`` alone when set (a file,
    or a directory holding libmuon_opt.so); else the install prefix (``$MUON_OPT_PREFIX/lib``,
    then this Python's ``sys.prefix/lib``, then the dynamic loader's own search by soname:
    LD_LIBRARY_PATH, the ld.so cache); then next to the package; then ``target/release`` of the
    repository this file lives in (a development checkout)."""
    env = os.environ.get("MUON_OPT_LIB")
    if env:
        path = Path(env)
        return [path / LIBRARY_NAME if path.is_dir() else path]
    prefixes = [os.environ.get("MUON_OPT_PREFIX"), sys.prefix]
    installed = [Path(p) / "lib" / SONAME for p in prefixes if p]
    pkg = Path(__file__).resolve().parent
    repo = pkg.parent.parent.parent  # bindings/python/muon_opt -> repository root
    return installed + [SONAME, pkg / LIBRARY_NAME, pkg.parent / LIBRARY_NAME, repo / "target" / "release" / LIBRARY_NAME]


# --- argument checks: ctypes would silently wrap an out-of-range integer and cut a string at
# an embedded NUL; both are refused here, before the value reaches C ---------------------------

_INTEGER_RANGES = {
    t: ((0, (1 << (8 * ctypes.sizeof(t))) - 1) if t(-1).value > 0 else
        (-(1 << (8 * ctypes.sizeof(t) - 1)), (1 << (8 * ctypes.sizeof(t) - 1)) - 1))
    for t in (ctypes.c_uint8, ctypes.c_uint16, c_uint32, c_uint64, c_int32, c_int64, c_size_t)
}


def check_integer(ctype, value, what):
    """``value`` as an int that fits ``ctype``; ValueError naming ``what`` otherwise (TypeError
    for a non-integer such as a float)."""
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{what}: expected an integer, got {type(value).__name__} {value!r}") from None
    low, high = _INTEGER_RANGES[ctype]
    if not low <= value <= high:
        raise ValueError(f"{what}: {value} is outside the range of {ctype.__name__} [{low}, {high}]")
    return value


def check_text(value, what):
    """``value`` (bytes) for a C string; ValueError naming ``what`` when it holds a NUL byte."""
    at = value.find(b"\0")
    if at >= 0:
        raise ValueError(f"{what}: embedded NUL byte at offset {at} (C would see only {value[:at]!r})")
    return value


def _checked_call(name, fn, argtypes):
    """``fn`` with its integer, address and string arguments checked against its prototype."""
    checks = []
    for i, t in enumerate(argtypes):
        if t in _INTEGER_RANGES:
            checks.append((i, lambda v, what, t=t: check_integer(t, v, what)))
        elif t is c_void_p:
            checks.append((i, lambda v, what: v if v is None else check_integer(c_uint64, v, what)))
        elif t is c_char_p:
            checks.append((i, lambda v, what: v if v is None else check_text(v, what)))

    def call(*args):
        for i, check in checks:
            if i < len(args) and not isinstance(args[i], ctypes._SimpleCData):
                check(args[i], f"{name} argument {i + 1}")
        return fn(*args)

    call.__name__ = name
    call.argtypes, call.restype = fn.argtypes, fn.restype
    return call


def _bind(cdll):
    def _errcheck(result, func, args):
        code = result.value
        if code != MUON_STATUS_SUCCESS:
            # Thread-local and replaced by the next failing call: read it right away, here.
            message = cdll.muon_last_error_message().decode("utf-8", "replace")
            raise MuonError(code, message, func.__name__)
        return code

    for name, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(cdll, name)
        fn.restype, fn.argtypes = restype, argtypes
        if restype is muon_status_t:
            fn.errcheck = _errcheck
        setattr(cdll, name, _checked_call(name, fn, argtypes))


def lib(path=None):
    """The loaded library (a ctypes.CDLL with every prototype bound); loads it on first call.

    Raises ImportError when no candidate loads or its major version differs from the mirror's.
    """
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = [Path(path)] if path is not None else library_candidates()
        errors = []
        for candidate in tried:
            # A bare soname (a str) is left to the dynamic loader's search.
            if isinstance(candidate, Path) and not candidate.exists():
                errors.append(f"{candidate}: not found")
                continue
            try:
                cdll = ctypes.CDLL(str(candidate))
            except OSError as e:
                errors.append(f"{candidate}: {e}")
                continue
            _bind(cdll)
            version = cdll.muon_get_version()
            if version // 10000 != MUON_VERSION_MAJOR:
                raise ImportError(
                    f"{candidate} is libmuon_opt {version} but these bindings mirror the "
                    f"{MUON_VERSION_CODE} header (major versions differ)"
                )
            cdll.path = str(candidate)
            _lib = cdll
            return _lib
        raise ImportError(
            "libmuon_opt.so could not be loaded (install it with `bash scripts/install.sh PREFIX` and set "
            "MUON_OPT_PREFIX=PREFIX, or set MUON_OPT_LIB to the library's path):\n  " + "\n  ".join(errors)
        )
