//! `muon_param_desc_t` (what the framework registers) and `muon_param_view_t` (where the
//! library keeps it).

use std::ffi::{CStr, c_char, c_void};

use crate::backend::cuda::CallerStream;
use crate::backend::cuda::init_copy::DeviceInit;
use crate::bail;
use crate::capi::boundary::{non_null, run_or};
use crate::capi::constants::{MUON_MXFP8_SCALES_COMPACT, MUON_MXFP8_SCALES_SWIZZLED, route_code};
use crate::config::Dtype;
use crate::error::Result;
use crate::init_data::InitData;
use crate::model::{ParamFlags, ParamSpec};
use crate::optimizer::ParamView;

/// Largest number of dimensions of a registered tensor.
pub const MUON_MAX_DIMS: usize = 4;

/// Description of one parameter. Initialise with muon_param_desc_init(), then set name, ndim
/// and shape (and the optional fields).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct muon_param_desc_t {
    /// sizeof(muon_param_desc_t) as compiled by the caller.
    pub struct_size: u32,
    /// Number of dimensions, 1..=MUON_MAX_DIMS.
    pub ndim: u32,
    /// Unique UTF-8 name (the checkpoint key); copied during the call.
    pub name: *const c_char,
    /// Dimensions, each >= 1; entries past ndim are ignored.
    pub shape: [i64; MUON_MAX_DIMS],
    /// Model dtype of the param buffer: MUON_DTYPE_BF16 or MUON_DTYPE_F32.
    pub dtype: u32,
    /// Bitwise OR of MUON_PARAM_FLAG_* values.
    pub flags: u32,
    /// Non-zero: copies of one logical weight (e.g. an embedding and its MTP duplicate) share
    /// a tie group and must route alike.
    pub tie_group: u32,
    /// Number of fused components (0 = not fused).
    pub num_splits: u32,
    /// num_splits row counts along dim 0 (dim 1 of an expert stack), summing to that dim.
    pub split_sizes: *const i64,
    /// High-precision initial values (NULL = zeros), read during the call: free or reuse the
    /// array when muon_optimizer_add_param returns. Host pointer on the host backend; device
    /// pointer on the cuda backend, copied device to device on the optimizer's stream (after
    /// the work queued on it) into memory the library frees at finalize.
    pub init_data: *const c_void,
    /// Dtype of init_data: MUON_DTYPE_F32 or MUON_DTYPE_BF16.
    pub init_dtype: u32,
    /// Multiplier on the learning rate of this param (default 1).
    pub lr_scale: f32,
    /// Multiplier on the weight decay of this param (default 1); none is applied to a param
    /// flagged MUON_PARAM_FLAG_NO_WEIGHT_DECAY or spared by muon_config_t.weight_decay_rule
    /// (by default every 1-D param and every `*.bias`, unless flagged
    /// MUON_PARAM_FLAG_WEIGHT_DECAY).
    pub wd_scale: f32,
    /// How many times split_sizes repeats along dim 0 (0 or 1 = once: consecutive
    /// components). Megatron's fused QKV `[groups·(q + k + v), hidden]` is split_sizes
    /// {q, k, v} with num_split_groups = the query groups: component c (Q, K or V) is the c-th
    /// block of every group, stacked in group order, orthogonalized as one matrix.
    pub num_split_groups: u32,
}

/// Where a registered parameter lives.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct muon_param_view_t {
    /// sizeof(muon_param_view_t) as compiled by the caller.
    pub struct_size: u32,
    /// MUON_ROUTE_MUON or MUON_ROUTE_ADAMW.
    pub route: u32,
    /// Bucket index: call muon_optimizer_wait_params(bucket) before the first use in forward.
    pub bucket: u32,
    /// Owner rank of a Muon param; -1 when no single rank owns it (AdamW shards, or an
    /// expert stack split across ranks).
    pub owner: i32,
    /// Element offset of the param in its buffer.
    pub offset: u64,
    /// Number of elements.
    pub numel: u64,
    /// Model-dtype storage (host pointer on the host backend, device pointer on cuda); NULL for
    /// MXFP8 params, whose values live only in the MXFP8 copies below.
    pub data: *mut c_void,
    /// Gradient storage (grad_dtype) the framework accumulates into.
    pub grad: *mut c_void,
    /// MXFP8 rowwise E4M3 data [rows, cols]; NULL unless MUON_PARAM_FLAG_MXFP8.
    pub mxfp8_rowwise_data: *mut u8,
    /// MXFP8 rowwise E8M0 scales; NULL unless MXFP8.
    pub mxfp8_rowwise_scales: *mut u8,
    /// MXFP8 columnwise E4M3 data [rows, cols] (not transposed); NULL unless MXFP8.
    pub mxfp8_colwise_data: *mut u8,
    /// MXFP8 columnwise E8M0 scales; NULL unless MXFP8.
    pub mxfp8_colwise_scales: *mut u8,
    /// MUON_MXFP8_SCALES_COMPACT or MUON_MXFP8_SCALES_SWIZZLED (config mxfp8_swizzled_scales);
    /// shapes from muon_mxfp8_scale_shape().
    pub mxfp8_scale_layout: u32,
    /// MXFP8 2-D view: rows = product of all dims but the last, cols = the last dim.
    pub mxfp8_rows: u64,
    /// See mxfp8_rows.
    pub mxfp8_cols: u64,
    /// MUON_DTYPE_* of @p data: the dtype the param was registered with.
    pub dtype: u32,
    /// MUON_DTYPE_* of @p grad: the config's grad_dtype.
    pub grad_dtype: u32,
}

/// Size of the first ABI version of the view (up to `mxfp8_cols`): a caller compiled against
/// it gets that many bytes written, without the dtypes.
pub(crate) const MIN_VIEW_SIZE: usize = std::mem::offset_of!(muon_param_view_t, dtype);

/// Size of the first ABI version of the struct (up to `wd_scale`); smaller struct_size values
/// are rejected, the fields after it take their defaults.
pub(crate) const MIN_DESC_SIZE: usize = std::mem::offset_of!(muon_param_desc_t, num_split_groups);

impl muon_param_view_t {
    /// The C form of `view`; `swizzled` is the config's `mxfp8_swizzled_scales`.
    pub fn new(view: ParamView, swizzled: bool) -> Self {
        let null = std::ptr::null_mut();
        let (parts, rows, cols) = view.mxfp8.map_or(([null; 4], 0, 0), |m| (m.parts, m.rows, m.cols));
        muon_param_view_t {
            struct_size: std::mem::size_of::<muon_param_view_t>() as u32,
            route: route_code(view.route),
            bucket: view.bucket,
            owner: view.owner.map_or(-1, |r| r as i32),
            offset: view.offset,
            numel: view.numel,
            data: view.data,
            grad: view.grad,
            mxfp8_rowwise_data: parts[0],
            mxfp8_rowwise_scales: parts[1],
            mxfp8_colwise_data: parts[2],
            mxfp8_colwise_scales: parts[3],
            mxfp8_scale_layout: if swizzled {
                MUON_MXFP8_SCALES_SWIZZLED
            } else {
                MUON_MXFP8_SCALES_COMPACT
            },
            mxfp8_rows: rows,
            mxfp8_cols: cols,
            dtype: view.dtype.code(),
            grad_dtype: view.grad_dtype.code(),
        }
    }
}

impl muon_param_desc_t {
    fn defaults() -> Self {
        muon_param_desc_t {
            struct_size: std::mem::size_of::<muon_param_desc_t>() as u32,
            ndim: 0,
            name: std::ptr::null(),
            shape: [0; MUON_MAX_DIMS],
            dtype: Dtype::Bf16.code(),
            flags: 0,
            tie_group: 0,
            num_splits: 0,
            split_sizes: std::ptr::null(),
            init_data: std::ptr::null(),
            init_dtype: Dtype::F32.code(),
            lr_scale: 1.0,
            wd_scale: 1.0,
            num_split_groups: 1,
        }
    }
}

/// @brief Fill @p desc with defaults (bf16, no flags, scales 1, no init data) and set
///        struct_size. NULL is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_param_desc_init(desc: *mut muon_param_desc_t) {
    run_or("muon_param_desc_init", (), || {
        if !desc.is_null() {
            // SAFETY: non-NULL, points to a muon_param_desc_t per the contract.
            unsafe { desc.write_unaligned(muon_param_desc_t::defaults()) };
        }
    })
}

/// A registration decoded from C: the spec and its initial values.
pub struct Decoded {
    pub spec: ParamSpec,
    pub init: Option<InitData>,
}

/// Decodes a caller's description; every pointer is read during this call only.
///
/// # Safety
/// `ptr` must be NULL or point to `struct_size` readable bytes whose pointers are valid as
/// documented on the fields.
/// `init_stream` is the stream a device `init_data` is copied on; None reads it as a host
/// pointer.
pub unsafe fn read_desc(ptr: *const muon_param_desc_t, init_stream: Option<CallerStream>) -> Result<Decoded> {
    non_null(ptr, "desc")?;
    let size = unsafe { std::ptr::read_unaligned(ptr.cast::<u32>()) } as usize;
    if size < MIN_DESC_SIZE {
        bail!(
            AbiMismatch,
            "desc->struct_size: {size} is smaller than the {MIN_DESC_SIZE} bytes of muon_param_desc_t; initialise it with muon_param_desc_init()"
        );
    }
    let mut desc = muon_param_desc_t::defaults();
    // SAFETY: the caller's struct holds `size` readable bytes; only the bytes both versions
    // have are copied over the defaults.
    unsafe {
        std::ptr::copy_nonoverlapping(
            ptr.cast::<u8>(),
            (&raw mut desc).cast::<u8>(),
            size.min(std::mem::size_of::<muon_param_desc_t>()),
        )
    };
    if desc.name.is_null() {
        bail!(NullArgument, "desc->name is NULL");
    }
    let name = match unsafe { CStr::from_ptr(desc.name) }.to_str() {
        Ok(name) => name.to_string(),
        Err(e) => bail!(InvalidParam, "desc->name: not valid UTF-8 ({e})"),
    };
    let ndim = desc.ndim as usize;
    if !(1..=MUON_MAX_DIMS).contains(&ndim) {
        bail!(
            InvalidParam,
            "param '{name}': ndim {ndim} is outside 1..={MUON_MAX_DIMS}"
        );
    }
    let mut shape = Vec::with_capacity(ndim);
    for (d, &dim) in desc.shape[..ndim].iter().enumerate() {
        if dim <= 0 {
            bail!(
                InvalidParam,
                "param '{name}': shape[{d}] is {dim}; every dimension must be >= 1"
            );
        }
        shape.push(dim as u64);
    }
    let splits = read_splits(&name, &desc)?;
    let spec = ParamSpec {
        name,
        shape,
        dtype: Dtype::from_code("desc->dtype", desc.dtype)?,
        flags: ParamFlags(desc.flags),
        tie_group: desc.tie_group,
        split_sizes: splits,
        split_groups: u64::from(desc.num_split_groups.max(1)),
        lr_scale: desc.lr_scale,
        wd_scale: desc.wd_scale,
    };
    spec.validate()?;
    let init_dtype = Dtype::from_code("desc->init_dtype", desc.init_dtype)?;
    let numel = spec.numel();
    let len = numel as usize * init_dtype.size();
    let init = match (desc.init_data.is_null(), init_stream) {
        (true, _) => None,
        // SAFETY: the caller provides `len` readable bytes at init_data (the values of
        // init_dtype; read as bytes, so any alignment does).
        (false, None) => Some(InitData::Host {
            dtype: init_dtype,
            bytes: unsafe { std::slice::from_raw_parts(desc.init_data.cast::<u8>(), len) }.to_vec(),
        }),
        (false, Some(stream)) => Some(InitData::Device {
            dtype: init_dtype,
            numel,
            copy: DeviceInit::copy_of(desc.init_data as u64, len, stream)?,
        }),
    };
    Ok(Decoded { spec, init })
}

fn read_splits(name: &str, desc: &muon_param_desc_t) -> Result<Vec<u64>> {
    if desc.num_splits == 0 {
        return Ok(Vec::new());
    }
    if desc.split_sizes.is_null() {
        bail!(
            NullArgument,
            "param '{name}': desc->split_sizes is NULL but num_splits is {}",
            desc.num_splits
        );
    }
    if desc.num_splits > 1 << 16 {
        bail!(
            InvalidParam,
            "param '{name}': num_splits {} exceeds 65536",
            desc.num_splits
        );
    }
    // SAFETY: the caller provides num_splits readable values.
    let raw = unsafe { std::slice::from_raw_parts(desc.split_sizes, desc.num_splits as usize) };
    raw.iter()
        .enumerate()
        .map(|(i, &s)| {
            if s <= 0 {
                bail!(
                    InvalidParam,
                    "param '{name}': split_sizes[{i}] is {s}; every component needs >= 1 row"
                );
            }
            Ok(s as u64)
        })
        .collect()
}
