//! What the framework needs to use one registered param after finalize: where its values,
//! gradient and MXFP8 copies live, which bucket to wait for, who owns it.

use std::ffi::c_void;

use super::Optimizer;
use crate::config::Dtype;
use crate::error::Result;
use crate::model::Route;

/// One param's placement and storage (host pointers on the host backend, device pointers on
/// cuda).
#[derive(Debug, Clone, Copy)]
pub struct ParamView {
    pub route: Route,
    /// The bucket `wait_params` takes before the param's first use in a forward.
    pub bucket: u32,
    /// The rank that owns the whole of a Muon param; None when no single rank owns it (AdamW
    /// shards, an expert stack split across ranks).
    pub owner: Option<u32>,
    /// Element offset in its buffer.
    pub offset: u64,
    pub numel: u64,
    /// Model-dtype storage; null for a param that lives only as MXFP8.
    pub data: *mut c_void,
    /// Gradient storage (grad dtype).
    pub grad: *mut c_void,
    pub mxfp8: Option<Mxfp8View>,
    /// The dtype of `data` (the registered model dtype).
    pub dtype: Dtype,
    /// The dtype of `grad` (the config's `grad_dtype`).
    pub grad_dtype: Dtype,
}

/// A param's MXFP8 copies.
#[derive(Debug, Clone, Copy)]
pub struct Mxfp8View {
    /// Rowwise data, rowwise scales, columnwise data, columnwise scales.
    pub parts: [*mut u8; 4],
    /// The data's `[rows, cols]`.
    pub rows: u64,
    pub cols: u64,
}

impl Optimizer {
    /// Param `id`'s view; fails before finalize, for an unknown id, and with sharded params
    /// while its bucket is not gathered (its storage is then another bucket's or stale).
    pub fn param_view(&self, id: u32) -> Result<ParamView> {
        let placement = self.plan_for(id)?.param(id as usize);
        let runtime = self.runtime()?;
        let p = id as usize;
        runtime.check_gathered("param_view", p)?;
        let mxfp8 = runtime.mxfp8_addresses(p).map(|parts| {
            let (rows, cols) = self.registry().params()[p].flat_2d();
            Mxfp8View { parts, rows, cols }
        });
        Ok(ParamView {
            route: self.registry().routes()[p],
            bucket: placement.bucket,
            owner: placement.single_owner(),
            offset: placement.offset,
            numel: placement.numel,
            data: runtime.address(p, false),
            grad: runtime.address(p, true),
            mxfp8,
            dtype: self.registry().params()[p].dtype,
            grad_dtype: self.config().grad_dtype,
        })
    }
}
