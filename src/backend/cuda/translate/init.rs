//! Initial values attached for the writes at finalize: a device copy is read in place as
//! `Mem::Init(p)`; host values (the emulated device and the dry runs beside the host backend:
//! a registered optimizer always hands the cuda backend a device copy) are copied in,
//! converted, by the casts that read them.

use super::Translator;
use crate::backend::cuda::action::{Action, Buf};
use crate::backend::ops::{InitSource, Mem, Span};
use crate::bail;
use crate::config::Dtype;
use crate::error::{Error, ErrorKind, Result};
use crate::numerics::bf16::bf16_to_f32;

/// A param's attached initial values.
#[derive(Debug)]
pub(super) enum Attached {
    /// Host bytes; the casts from them are host-to-device copies of converted values.
    Host { dtype: Dtype, bytes: Vec<u8> },
    /// A device copy mapped as `Buf::Mem(Mem::Init(p))`.
    Device { dtype: Dtype },
}

impl Translator {
    pub(super) fn attach_init(
        &mut self,
        param: u32,
        dtype: Dtype,
        numel: u64,
        source: &InitSource,
    ) -> Result<Vec<Action>> {
        if self.init.contains_key(&param) {
            bail!(Internal, "init of param {param} is attached twice");
        }
        let bytes = numel * dtype.size() as u64;
        let attached = match source {
            InitSource::Host(host) if host.len() as u64 == bytes => Attached::Host {
                dtype,
                bytes: host.clone(),
            },
            InitSource::Host(host) => bail!(
                Internal,
                "init of param {param}: {} bytes for {numel} values",
                host.len()
            ),
            &InitSource::Device(address) => {
                self.map.insert(Buf::Mem(Mem::Init(param)), (address, bytes));
                Attached::Device { dtype }
            }
        };
        self.init.insert(param, attached);
        Ok(Vec::new())
    }

    /// Forgets param `param`'s initial values (bookkeeping only: a device copy stays the
    /// caller's, freed after the runtime's synchronize at the end of finalize).
    pub(super) fn detach_init(&mut self, param: u32) -> Result<Vec<Action>> {
        match self.init.remove(&param) {
            Some(_) => {
                self.map.remove(&Buf::Mem(Mem::Init(param)));
                Ok(Vec::new())
            }
            None => bail!(Internal, "init of param {param} is not attached"),
        }
    }

    /// The dtype of param `param`'s attached device copy.
    pub(super) fn init_dtype(&self, param: u32) -> Result<Dtype> {
        match self.init.get(&param) {
            Some(&Attached::Device { dtype }) => Ok(dtype),
            Some(Attached::Host { .. }) => bail!(Internal, "host init of param {param} is read by casts only"),
            None => bail!(Internal, "init of param {param} is not attached"),
        }
    }

    /// `cast(src, dst)` when `src` is in host initial values: a copy of the converted values
    /// (f32 → bf16 rounds to nearest even, as the cast kernel); None for any other `src`.
    pub(super) fn cast_from_host_init(&self, src: Span, dst: Span) -> Option<Result<Vec<Action>>> {
        let Mem::Init(param) = src.mem else { return None };
        let Attached::Host { dtype, bytes } = self.init.get(&param)? else {
            return None;
        };
        let size = dtype.size();
        let window = bytes.get(src.start as usize * size..(src.start + src.len) as usize * size);
        let Some(window) = window else {
            let message = format!("span {src:?} exceeds the initial values of param {param}");
            return Some(Err(Error::new(ErrorKind::Internal, message)));
        };
        let bits: Vec<u32> = match dtype {
            Dtype::F32 => window
                .chunks_exact(4)
                .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::Bf16 => window
                .chunks_exact(2)
                .map(|c| bf16_to_f32(u16::from_ne_bytes([c[0], c[1]])).to_bits())
                .collect(),
        };
        Some(self.upload(dst, &bits))
    }
}
