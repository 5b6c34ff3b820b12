//! Registration through the C API: the errors of a bad param, and `init_data` copied at
//! registration in either dtype.

use std::ffi::CString;
use std::ptr::null_mut;

use super::{default_config, desc, last_error, single_rank_optimizer, teardown};
use crate::capi::constants::*;
use crate::capi::optimizer::*;
use crate::capi::status::muon_status_t::*;

#[test]
fn registration_errors_through_the_c_api() {
    let mut cfg = default_config();
    cfg.vocab_size = 1000;
    let (comm, opt) = single_rank_optimizer(&cfg);
    let emb = CString::new("embedding.weight").unwrap();
    let mut d = desc(&emb, &[1000, 64]);
    d.flags = MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT;
    d.tie_group = 1;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &d, null_mut()) },
        MUON_STATUS_SUCCESS
    );
    let mtp = CString::new("mtp.embedding.weight").unwrap();
    let mut dup = desc(&mtp, &[1000, 64]);
    dup.tie_group = 1;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &dup, null_mut()) },
        MUON_STATUS_ROUTING_CONFLICT
    );
    let message = last_error();
    assert!(
        message.contains("'embedding.weight'") && message.contains("'mtp.embedding.weight'"),
        "{message}"
    );
    dup.tie_group = 0;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &dup, null_mut()) },
        MUON_STATUS_ROUTING_CONFLICT
    );
    assert!(last_error().contains("vocab_size 1000"));
    let bad_utf8 = CString::new(vec![0xff, 0xfe]).unwrap();
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &desc(&bad_utf8, &[4]), null_mut()) },
        MUON_STATUS_INVALID_PARAM
    );
    assert!(last_error().contains("UTF-8"));
    let neg = CString::new("neg").unwrap();
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &desc(&neg, &[4, -2]), null_mut()) },
        MUON_STATUS_INVALID_PARAM
    );
    assert!(last_error().contains("shape[1] is -2"));
    let mut d5 = desc(&neg, &[4]);
    d5.ndim = 5;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &d5, null_mut()) },
        MUON_STATUS_INVALID_PARAM
    );
    let mut small = desc(&neg, &[4]);
    small.struct_size = 4;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &small, null_mut()) },
        MUON_STATUS_ABI_MISMATCH
    );
    let mut route = 9;
    assert_eq!(
        unsafe { muon_optimizer_param_route(opt, 0, &mut route) },
        MUON_STATUS_SUCCESS
    );
    assert_eq!(route, MUON_ROUTE_ADAMW);
    assert_eq!(
        unsafe { muon_optimizer_param_route(opt, 1, &mut route) },
        MUON_STATUS_INVALID_ARGUMENT
    );
    let split = CString::new("qkv").unwrap();
    let mut fused = desc(&split, &[96, 32]);
    let sizes = [32i64, 32, 16];
    fused.num_splits = 3;
    fused.split_sizes = sizes.as_ptr();
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &fused, null_mut()) },
        MUON_STATUS_INVALID_PARAM
    );
    assert!(last_error().contains("sum to 80, but dim 0 is 96"), "{}", last_error());
    teardown(comm, opt);
}

/// The state an optimizer starts from, as bits: every param's model-dtype values, then every
/// owned master as (param, its values' range in the param, values).
type InitialState = (Vec<Vec<u32>>, Vec<(u32, std::ops::Range<usize>, Vec<u32>)>);

fn initial_state(opt: *mut muon_optimizer_t) -> InitialState {
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let (mut params, mut masters) = (Vec::new(), Vec::new());
    let status = crate::capi::handle::with_mut::<crate::optimizer::Optimizer>("test", opt, "opt", |o| {
        let rt = o.runtime_mut("test")?;
        for p in 0..rt.plan().params.len() {
            params.push(bits(rt.param_values(p)?));
        }
        for owned in rt.owned_state()? {
            let range = owned.range.start as usize..owned.range.end as usize;
            masters.push((owned.param, range, bits(owned.master)));
        }
        Ok(())
    });
    assert_eq!(status, MUON_STATUS_SUCCESS, "{}", last_error());
    (params, masters)
}

/// `init_data` is read during `add_param` only (the caller overwrites it right after with
/// other values), in either dtype: bf16 values and the same values given as f32 start every
/// param and every master at exactly those values.
#[test]
fn init_data_is_copied_at_registration_in_either_dtype() {
    use crate::numerics::bf16::{bf16_to_f32, f32_to_bf16_rne};
    let cfg = default_config();
    let names = [c"layers.0.fc1.weight", c"layers.0.fc1.bias"];
    let shapes: [&[i64]; 2] = [&[64, 32], &[32]];
    let values = |p: usize, n: usize| -> Vec<u16> {
        (0..n)
            .map(|i| f32_to_bf16_rne(((p * 131 + i * 7) % 97) as f32 / 97.0 - 0.5))
            .collect()
    };
    let expected: Vec<Vec<u32>> = shapes
        .iter()
        .enumerate()
        .map(|(p, shape)| {
            let n = shape.iter().product::<i64>() as usize;
            values(p, n).iter().map(|&b| bf16_to_f32(b).to_bits()).collect()
        })
        .collect();
    for dtype in [MUON_DTYPE_BF16, MUON_DTYPE_F32] {
        let (comm, opt) = single_rank_optimizer(&cfg);
        for (p, (name, shape)) in names.iter().zip(shapes).enumerate() {
            let bf16 = values(p, shape.iter().product::<i64>() as usize);
            let mut f32s: Vec<f32> = bf16.iter().map(|&b| bf16_to_f32(b)).collect();
            let mut halves = bf16.clone();
            let mut d = desc(name, shape);
            d.init_dtype = dtype;
            d.init_data = if dtype == MUON_DTYPE_BF16 {
                halves.as_ptr().cast()
            } else {
                f32s.as_ptr().cast()
            };
            assert_eq!(
                unsafe { muon_optimizer_add_param(opt, &d, null_mut()) },
                MUON_STATUS_SUCCESS,
                "{}",
                last_error()
            );
            halves.fill(0x3F80);
            f32s.fill(2.0);
        }
        assert_eq!(
            unsafe { muon_optimizer_finalize(opt) },
            MUON_STATUS_SUCCESS,
            "{}",
            last_error()
        );
        let (params, masters) = initial_state(opt);
        teardown(comm, opt);
        assert_eq!(params, expected, "dtype {dtype}: params hold the values given");
        assert!(!masters.is_empty());
        for (p, range, master) in masters {
            assert_eq!(
                master, expected[p as usize][range],
                "dtype {dtype}: master of param {p}"
            );
        }
    }
}
