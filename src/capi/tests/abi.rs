//! The versioned structs: configs and param descriptions of every released layout, torn
//! sizes, and each invalid field named with its rule.

use std::ffi::CString;

use super::{default_config, desc, last_error};
use crate::capi::config::*;
use crate::capi::constants::*;
use crate::capi::param::*;
use crate::capi::status::muon_status_t::{self, *};

fn validate(cfg: &muon_config_t) -> (muon_status_t, String) {
    let status = unsafe { muon_config_validate(cfg) };
    (status, last_error())
}

/// A param description of the first ABI (ending at wd_scale) is accepted with one split
/// group whatever lies beyond its struct_size; the current one carries num_split_groups
/// (Megatron's QKV split per query group), checked against the rows.
#[test]
fn a_param_desc_of_the_first_abi_defaults_the_split_groups() {
    let sizes = [8i64, 4, 4];
    let name = CString::new("attn.qkv.weight").unwrap();
    let mut d = desc(&name, &[48, 32]);
    d.num_splits = 3;
    d.split_sizes = sizes.as_ptr();
    d.num_split_groups = 3;
    let read = unsafe { crate::capi::param::read_desc(&d, None) }.unwrap();
    assert_eq!(
        (read.spec.split_sizes.clone(), read.spec.split_groups),
        (vec![8, 4, 4], 3)
    );
    d.struct_size = std::mem::offset_of!(muon_param_desc_t, num_split_groups) as u32;
    let err = unsafe { crate::capi::param::read_desc(&d, None) }.err().unwrap();
    assert!(err.message.contains("sum to 16, but dim 0 is 48"), "{err}");
    d.num_split_groups = 2;
    d.struct_size = std::mem::size_of::<muon_param_desc_t>() as u32;
    let err = unsafe { crate::capi::param::read_desc(&d, None) }.err().unwrap();
    assert!(err.message.contains("× 2 groups sum to 32"), "{err}");
    d.struct_size = std::mem::offset_of!(muon_param_desc_t, num_split_groups) as u32 - 4;
    let err = unsafe { crate::capi::param::read_desc(&d, None) }.err().unwrap();
    assert_eq!(err.kind, crate::error::ErrorKind::AbiMismatch);
}

#[test]
fn defaults_validate_and_match_the_design() {
    let cfg = default_config();
    assert_eq!(cfg.struct_size as usize, std::mem::size_of::<muon_config_t>());
    assert_eq!(validate(&cfg).0, MUON_STATUS_SUCCESS);
    assert_eq!(cfg.muon_layout, MUON_LAYOUT_COMPACT);
    assert_eq!(cfg.muon_momentum, 0.95);
    assert_eq!(cfg.muon_num_ns_steps, 5);
    assert_eq!((cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps), (0.9, 0.999, 1e-8));
    assert_eq!(cfg.muon_scale_mode, MUON_SCALE_SPECTRAL);
    assert_eq!(cfg.muon_coefficient_set, MUON_COEFFICIENTS_QUINTIC);
    assert_eq!(cfg.host_threads, 0);
    assert_eq!(cfg.muon_tp_mode, MUON_TP_MODE_DUPLICATED);
    assert_eq!(cfg.weight_decay_rule, MUON_WEIGHT_DECAY_RULE_MEGATRON);
}

/// A caller compiled against the first ABI passes a struct that ends at host_comm_mode: it is
/// accepted, and the fields appended since (host_threads) take their defaults whatever lies
/// beyond its struct_size.
#[test]
fn a_config_of_the_first_abi_defaults_the_appended_fields() {
    let mut cfg = default_config();
    cfg.host_threads = 4;
    cfg.struct_size = std::mem::offset_of!(muon_config_t, host_threads) as u32;
    cfg.muon_momentum = 0.5;
    let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
    assert_eq!((read.host_threads, read.muon_momentum), (0, 0.5));
    cfg.struct_size -= 4;
    let (status, message) = validate(&cfg);
    assert_eq!(status, MUON_STATUS_ABI_MISMATCH);
    assert!(message.contains("oldest supported muon_config_t"), "{message}");
}

/// A field appended behind a reserved word: set to `code` in a current struct it is read
/// (`is_default` fails); at every `older` struct_size the default is read whatever the field and
/// the reserved words hold, an invalid code too (they lie beyond or in the padding of that
/// older struct).
fn older_sizes_read_the_default(
    set: impl Fn(&mut muon_config_t, u32),
    code: u32,
    is_default: impl Fn(&crate::config::Config) -> bool,
    older: &[u32],
) {
    let mut cfg = default_config();
    set(&mut cfg, code);
    (
        cfg.reserved,
        cfg.reserved2,
        cfg.reserved3,
        cfg.reserved4,
        cfg.reserved5,
        cfg.reserved6,
    ) = (
        0xABAB_ABAB,
        0xABAB_ABAB,
        0xABAB_ABAB,
        0xABAB_ABAB,
        0xABAB_ABAB,
        0xABAB_ABAB,
    );
    let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
    assert!(!is_default(&read), "code {code} is read at the current size");
    set(&mut cfg, 0xABAB_ABAB);
    for &size in older {
        cfg.struct_size = size;
        let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
        assert!(is_default(&read), "struct_size {size}");
    }
}

/// muon_ns_method follows the released 120-byte layout (which ended at muon_ns_eps) after a
/// reserved word filling that layout's padding, so the struct grew to 128 bytes and no older
/// size reads it: a caller compiled against any older header gets the standard iteration.
#[test]
fn muon_ns_method_appends_a_layout_of_its_own_size_and_older_ones_get_standard() {
    use crate::config::NsMethod;
    assert_eq!(std::mem::offset_of!(muon_config_t, reserved), 116);
    assert_eq!(std::mem::offset_of!(muon_config_t, muon_ns_method), 120);
    let cfg = default_config();
    assert_eq!((cfg.muon_ns_method, cfg.reserved), (MUON_NS_METHOD_STANDARD, 0));
    older_sizes_read_the_default(
        |c, v| c.muon_ns_method = v,
        MUON_NS_METHOD_GRAM,
        |r| r.muon_ns_method == NsMethod::Standard,
        &[120, 112, 104],
    );
}

/// muon_ownership follows the released 128-byte layout (which ended at muon_ns_method) after a
/// second reserved word filling that layout's padding: 136 bytes, and a caller compiled against
/// any older header gets the default, auto (balanced without a declared network, which no older
/// header can declare). An invalid code at the current size, and contiguous with the padded
/// layout, are refused naming the field.
#[test]
fn muon_ownership_appends_a_layout_of_its_own_size_and_older_ones_get_auto() {
    use crate::config::MuonOwnership;
    assert_eq!(std::mem::offset_of!(muon_config_t, reserved2), 124);
    assert_eq!(std::mem::offset_of!(muon_config_t, muon_ownership), 128);
    let mut cfg = default_config();
    assert_eq!((cfg.muon_ownership, cfg.reserved2), (MUON_OWNERSHIP_AUTO, 0));
    older_sizes_read_the_default(
        |c, v| c.muon_ownership = v,
        MUON_OWNERSHIP_CONTIGUOUS,
        |r| r.muon_ownership == MuonOwnership::Auto,
        &[128, 120, 112, 104],
    );
    cfg.muon_ownership = 0xABAB_ABAB;
    let (status, message) = validate(&cfg);
    assert_eq!(status, MUON_STATUS_INVALID_ENUM_VALUE);
    assert!(
        message.contains(
            "muon_ownership: unknown value 2880154539; valid values are 0 (balanced), 1 (contiguous), 2 (auto)"
        ),
        "{message}"
    );
    cfg.muon_ownership = MUON_OWNERSHIP_CONTIGUOUS;
    cfg.muon_layout = MUON_LAYOUT_PADDED;
    let (status, message) = validate(&cfg);
    assert_eq!(status, MUON_STATUS_INCOMPATIBLE_OPTIONS);
    assert!(
        message.contains("muon_ownership: contiguous needs a compact, compact_rooted or allreduce muon_layout"),
        "{message}"
    );
}

/// weight_decay_rule follows the released 136-byte layout (which ended at muon_ownership) after
/// a third reserved word filling that layout's padding: 144 bytes, and a caller compiled
/// against any older header gets the flagged rule it was built with (only NO_WEIGHT_DECAY
/// exempts a param), whatever lies beyond its struct; the current layout reads every rule.
#[test]
fn weight_decay_rule_appends_a_layout_of_its_own_size_and_older_ones_get_flagged() {
    use crate::config::WeightDecayRule;
    assert_eq!(std::mem::offset_of!(muon_config_t, reserved3), 132);
    assert_eq!(std::mem::offset_of!(muon_config_t, weight_decay_rule), 136);
    assert_eq!(
        (std::mem::offset_of!(muon_config_t, weight_decay_rule) + 4).next_multiple_of(8),
        144
    );
    let cfg = default_config();
    assert_eq!(
        (cfg.weight_decay_rule, cfg.reserved3),
        (MUON_WEIGHT_DECAY_RULE_MEGATRON, 0)
    );
    for code in [
        MUON_WEIGHT_DECAY_RULE_MEGATRON,
        MUON_WEIGHT_DECAY_RULE_MEGATRON_QK_LAYERNORM,
    ] {
        older_sizes_read_the_default(
            |c, v| c.weight_decay_rule = v,
            code,
            |r| r.weight_decay_rule == WeightDecayRule::Flagged,
            &[136, 128, 120, 112, 104],
        );
    }
    for &rule in WeightDecayRule::ALL {
        let raw = muon_config_t::from_config(&crate::config::Config {
            weight_decay_rule: rule,
            ..Default::default()
        });
        let read = unsafe { crate::capi::config::read_config(&raw) }.unwrap();
        assert_eq!(read.weight_decay_rule, rule, "{}", rule.name());
    }
}

/// muon_variant, adaptive_muon_beta2 and adaptive_muon_eps follow the released 192-byte layout
/// (which ended at expert_network, on the struct's alignment): 208 bytes, and a caller
/// compiled against any older header gets standard Muon whatever lies beyond its struct; the
/// current layout reads NorMuon with its β2 and ε.
#[test]
fn muon_variant_appends_a_layout_of_its_own_size_and_older_ones_get_standard() {
    use crate::config::{DEFAULT_ADAPTIVE_MUON_BETA2, DEFAULT_ADAPTIVE_MUON_EPS, MuonVariant};
    assert_eq!(std::mem::offset_of!(muon_config_t, muon_variant), 192);
    assert_eq!(std::mem::offset_of!(muon_config_t, adaptive_muon_eps), 200);
    assert_eq!(RELEASED_CONFIG_LAYOUTS[8], ("adaptive_muon_eps", 208));
    let cfg = default_config();
    assert_eq!(
        (cfg.muon_variant, cfg.adaptive_muon_beta2, cfg.adaptive_muon_eps),
        (MUON_VARIANT_STANDARD, 0.95, 1e-8)
    );
    older_sizes_read_the_default(
        |c, v| c.muon_variant = v,
        MUON_VARIANT_NORMUON,
        |r| r.muon_variant == MuonVariant::Standard,
        &[192, 144, 136, 128, 120, 112, 104],
    );
    let mut cfg = default_config();
    (cfg.muon_variant, cfg.adaptive_muon_beta2, cfg.adaptive_muon_eps) = (MUON_VARIANT_NORMUON, 0.9, 1e-6);
    let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
    assert_eq!(
        (read.muon_variant, read.adaptive_muon_beta2, read.adaptive_muon_eps),
        (MuonVariant::Normuon, 0.9, 1e-6)
    );
    cfg.muon_variant = MUON_VARIANT_ADAMUON;
    let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
    assert_eq!(read.muon_variant, MuonVariant::Adamuon);
    cfg.struct_size = 192;
    let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
    assert_eq!(
        (read.muon_variant, read.adaptive_muon_beta2, read.adaptive_muon_eps),
        (
            MuonVariant::Standard,
            DEFAULT_ADAPTIVE_MUON_BETA2,
            DEFAULT_ADAPTIVE_MUON_EPS
        )
    );
}

/// param_sharding, reshard_after_forward and param_prefetch_buckets follow the released
/// 208-byte layout: 224 bytes, and a caller compiled against any older header gets replicated
/// params whatever lies beyond its struct; the current layout reads sharded with its policy.
#[test]
fn param_sharding_appends_a_layout_of_its_own_size_and_older_ones_get_replicated() {
    use crate::config::{DEFAULT_PARAM_PREFETCH_BUCKETS, ParamSharding};
    assert_eq!(std::mem::offset_of!(muon_config_t, reserved4), 204);
    assert_eq!(std::mem::offset_of!(muon_config_t, param_sharding), 208);
    assert_eq!(std::mem::offset_of!(muon_config_t, param_prefetch_buckets), 216);
    assert_eq!(RELEASED_CONFIG_LAYOUTS[9], ("param_prefetch_buckets", 224));
    let cfg = default_config();
    assert_eq!(
        (
            cfg.param_sharding,
            cfg.reshard_after_forward,
            cfg.param_prefetch_buckets
        ),
        (MUON_PARAM_SHARDING_REPLICATED, 1, DEFAULT_PARAM_PREFETCH_BUCKETS)
    );
    older_sizes_read_the_default(
        |c, v| c.param_sharding = v,
        MUON_PARAM_SHARDING_SHARDED,
        |r| r.param_sharding == ParamSharding::Replicated,
        &[208, 192, 144, 136, 128, 120, 112, 104],
    );
    let mut cfg = default_config();
    (
        cfg.param_sharding,
        cfg.reshard_after_forward,
        cfg.param_prefetch_buckets,
    ) = (MUON_PARAM_SHARDING_SHARDED, 0, 3);
    let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
    assert_eq!(
        (
            read.param_sharding,
            read.reshard_after_forward,
            read.param_prefetch_buckets
        ),
        (ParamSharding::Sharded, false, 3)
    );
    cfg.struct_size = 208;
    let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
    assert_eq!(
        (
            read.param_sharding,
            read.reshard_after_forward,
            read.param_prefetch_buckets
        ),
        (ParamSharding::Replicated, true, DEFAULT_PARAM_PREFETCH_BUCKETS)
    );
}

/// muon_tp_mode's default is duplicated (Megatron-LM's since its PR #6380) in the current
/// layout; the codes keep their meaning, so a struct of an older layout holding the
/// MUON_TP_MODE_BLOCKWISE its header's MUON_CONFIG_INIT wrote reads blockwise, one holding
/// duplicated reads duplicated, and the 104-byte layout, which has no muon_tp_mode, reads
/// blockwise whatever lies beyond it.
#[test]
fn older_layouts_keep_the_blockwise_tp_mode_they_meant() {
    use crate::config::TpMode;
    let read = |cfg: &muon_config_t| unsafe { crate::capi::config::read_config(cfg) }.unwrap().muon_tp_mode;
    let mut cfg = default_config();
    assert_eq!(read(&cfg), TpMode::Duplicated);
    for size in [136, 128, 120, 112] {
        cfg.struct_size = size;
        cfg.muon_tp_mode = MUON_TP_MODE_BLOCKWISE;
        assert_eq!(read(&cfg), TpMode::Blockwise, "struct_size {size}");
        cfg.muon_tp_mode = MUON_TP_MODE_DUPLICATED;
        assert_eq!(read(&cfg), TpMode::Duplicated, "struct_size {size}");
    }
    cfg.struct_size = 104;
    for word in [MUON_TP_MODE_DUPLICATED, MUON_TP_MODE_DISTRIBUTED, 0xABAB_ABAB] {
        cfg.muon_tp_mode = word;
        assert_eq!(read(&cfg), TpMode::Blockwise, "word {word}");
    }
}

/// Every method and ownership survives the C struct both ways: Config → muon_config_t → Config.
/// network and expert_network (two muon_network_t) follow the 144-byte layout: 192 bytes. A
/// caller compiled against any older header gets both undeclared whatever lies beyond its
/// struct_size; a declared network with a negative or NaN latency, or a zero, negative or
/// infinite bandwidth, or a declared word other than 0 or 1, is refused naming the field;
/// undeclared figures are ignored.
#[test]
fn the_networks_append_a_layout_of_their_own_size_older_ones_are_undeclared_and_bad_figures_are_named() {
    assert_eq!(std::mem::offset_of!(muon_config_t, network), 144);
    assert_eq!(std::mem::offset_of!(muon_config_t, expert_network), 168);
    assert_eq!(std::mem::size_of::<muon_network_t>(), 24);
    let declared = muon_network_t {
        declared: 1,
        reserved: 0,
        hop_latency_us: 14.0,
        bus_bandwidth_gbps: 45.0,
    };
    let mut cfg = default_config();
    assert_eq!((cfg.network.declared, cfg.expert_network.declared), (0, 0));
    cfg.network = declared;
    cfg.expert_network = muon_network_t {
        hop_latency_us: 3.4,
        bus_bandwidth_gbps: 360.0,
        ..declared
    };
    let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
    assert_eq!(
        read.network.map(|n| (n.hop_latency_us, n.bus_bandwidth_gbps)),
        Some((14.0, 45.0))
    );
    assert_eq!(read.expert_network.map(|n| n.bus_bandwidth_gbps), Some(360.0));
    for size in [144, 136, 128, 120, 112, 104] {
        cfg.struct_size = size;
        let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
        assert_eq!((read.network, read.expert_network), (None, None), "struct_size {size}");
    }
    let bad: [(&str, f64, f64, &str); 6] = [
        (
            "network",
            -1.0,
            45.0,
            "network.hop_latency_us: -1 must be finite and >= 0",
        ),
        (
            "network",
            f64::NAN,
            45.0,
            "network.hop_latency_us: NaN must be finite and >= 0",
        ),
        (
            "network",
            14.0,
            0.0,
            "network.bus_bandwidth_gbps: 0 must be finite and > 0",
        ),
        (
            "expert_network",
            14.0,
            -3.0,
            "expert_network.bus_bandwidth_gbps: -3 must be finite and > 0",
        ),
        (
            "expert_network",
            14.0,
            f64::INFINITY,
            "expert_network.bus_bandwidth_gbps: inf must be finite",
        ),
        (
            "expert_network",
            14.0,
            f64::NAN,
            "expert_network.bus_bandwidth_gbps: NaN must be finite",
        ),
    ];
    for (field, hop, bandwidth, expected) in bad {
        let mut cfg = default_config();
        let network = muon_network_t {
            hop_latency_us: hop,
            bus_bandwidth_gbps: bandwidth,
            ..declared
        };
        if field == "network" {
            cfg.network = network;
        } else {
            cfg.expert_network = network;
        }
        let (status, message) = validate(&cfg);
        assert_eq!(status, MUON_STATUS_OUT_OF_RANGE, "{field} {hop} {bandwidth}");
        assert!(message.contains(expected), "{message}");
    }
    let mut cfg = default_config();
    cfg.network = muon_network_t {
        declared: 2,
        ..declared
    };
    let (status, message) = validate(&cfg);
    assert_eq!(status, MUON_STATUS_OUT_OF_RANGE);
    assert!(message.contains("network.declared: 2 is not a boolean"), "{message}");
    cfg.network = muon_network_t {
        declared: 0,
        hop_latency_us: f64::NAN,
        bus_bandwidth_gbps: -1.0,
        ..declared
    };
    assert_eq!(validate(&cfg).0, MUON_STATUS_SUCCESS, "undeclared figures are ignored");
}

/// Every method, ownership and network survives the C struct both ways: Config →
/// muon_config_t → Config.
#[test]
fn muon_ns_method_ownership_and_networks_round_trip_through_the_c_struct() {
    use crate::config::{Config, MuonOwnership, Network, NsMethod};
    let ib = Network {
        hop_latency_us: 14.0,
        bus_bandwidth_gbps: 45.0,
    };
    for &method in NsMethod::ALL {
        for &ownership in MuonOwnership::ALL {
            let cfg = Config {
                muon_ns_method: method,
                muon_ownership: ownership,
                network: (ownership != MuonOwnership::Balanced).then_some(ib),
                expert_network: (ownership == MuonOwnership::Auto).then_some(Network {
                    hop_latency_us: 0.0,
                    ..ib
                }),
                ..Config::default()
            };
            let raw = muon_config_t::from_config(&cfg);
            assert_eq!(
                (raw.muon_ns_method, raw.muon_ownership),
                (method.code(), ownership.code())
            );
            assert_eq!(raw.to_config().unwrap(), cfg, "{} {}", method.name(), ownership.name());
            let read = unsafe { crate::capi::config::read_config(&raw) }.unwrap();
            assert_eq!(read, cfg);
        }
    }
}

/// Only the sizes of released layouts are accepted: a struct_size cutting a field in half
/// (sizeof − 2 and − 4 cut expert_network) is ABI_MISMATCH naming the size; every released size and a
/// larger one (a newer header) pass.
#[test]
fn a_torn_config_struct_size_is_refused() {
    let size = std::mem::size_of::<muon_config_t>() as u32;
    for torn in [size - 2, size - 4, MIN_CONFIG_SIZE as u32 + 2] {
        let mut cfg = default_config();
        cfg.struct_size = torn;
        let (status, message) = validate(&cfg);
        assert_eq!(status, MUON_STATUS_ABI_MISMATCH, "struct_size {torn}");
        assert!(
            message.contains(&format!(
                "cfg->struct_size: {torn} is not the size of a released muon_config_t"
            )),
            "{message}"
        );
    }
    let released = released_config_sizes();
    assert_eq!(released, [104, 112, 120, 128, 136, 144, 192, 208, 224, 424, 432]);
    for ok in released {
        let mut cfg = default_config();
        cfg.struct_size = ok as u32;
        assert_eq!(validate(&cfg).0, MUON_STATUS_SUCCESS, "struct_size {ok}");
    }
}

#[test]
fn each_invalid_field_gets_its_status_and_names_the_field() {
    type Edit = fn(&mut muon_config_t);
    let cases: Vec<(Edit, muon_status_t, &str)> = vec![
        (
            |c| c.muon_layout = 7,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_layout: unknown value 7",
        ),
        (|c| c.grad_dtype = 9, MUON_STATUS_INVALID_ENUM_VALUE, "grad_dtype"),
        (
            |c| c.muon_coefficient_set = 10,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_coefficient_set",
        ),
        (
            |c| c.muon_ns_precision = 3,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_ns_precision",
        ),
        (
            |c| c.muon_scale_mode = 3,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_scale_mode",
        ),
        (
            |c| c.muon_tp_mode = 3,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_tp_mode: unknown value 3",
        ),
        (
            |c| c.muon_ns_eps = f32::NAN,
            MUON_STATUS_OUT_OF_RANGE,
            "muon_ns_eps: NaN must be finite and > 0",
        ),
        (
            |c| c.muon_ns_method = 2,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_ns_method: unknown value 2; valid values are 0 (standard), 1 (gram)",
        ),
        (
            |c| c.weight_decay_rule = 3,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "weight_decay_rule: unknown value 3; valid values are 0 (megatron), 1 (megatron_qk_layernorm), 2 (flagged)",
        ),
        (
            |c| c.muon_variant = MUON_VARIANT_ADAMUON + 1,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_variant: unknown value 3; valid values are 0 (standard), 1 (normuon), 2 (adamuon)",
        ),
        (
            |c| c.param_sharding = 2,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "param_sharding: unknown value 2; valid values are 0 (replicated), 1 (sharded)",
        ),
        (
            |c| c.reshard_after_forward = 2,
            MUON_STATUS_OUT_OF_RANGE,
            "reshard_after_forward: 2 is not a boolean",
        ),
        (
            |c| (c.param_sharding, c.overlap_param_gather) = (MUON_PARAM_SHARDING_SHARDED, 0),
            MUON_STATUS_INCOMPATIBLE_OPTIONS,
            "param_sharding: sharded needs overlap_param_gather = 1",
        ),
        (
            |c| (c.param_sharding, c.overlap_grad_reduce) = (MUON_PARAM_SHARDING_SHARDED, 0),
            MUON_STATUS_INCOMPATIBLE_OPTIONS,
            "param_sharding: sharded needs overlap_grad_reduce = 1",
        ),
        (
            |c| c.adaptive_muon_beta2 = 1.0,
            MUON_STATUS_OUT_OF_RANGE,
            "adaptive_muon_beta2: 1 is outside [0, 1)",
        ),
        (
            |c| c.adaptive_muon_eps = f32::INFINITY,
            MUON_STATUS_OUT_OF_RANGE,
            "adaptive_muon_eps: inf must be finite and > 0",
        ),
        (
            |c| c.host_comm_mode = 3,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "host_comm_mode",
        ),
        (
            |c| c.host_threads = 1025,
            MUON_STATUS_OUT_OF_RANGE,
            "host_threads: 1025 is outside 0..=1024",
        ),
        (
            |c| c.muon_momentum = 1.0,
            MUON_STATUS_OUT_OF_RANGE,
            "muon_momentum: 1 is outside [0, 1)",
        ),
        (|c| c.muon_momentum = -0.1, MUON_STATUS_OUT_OF_RANGE, "muon_momentum"),
        (
            |c| c.muon_momentum = f32::NAN,
            MUON_STATUS_OUT_OF_RANGE,
            "muon_momentum",
        ),
        (|c| c.adam_beta1 = 1.5, MUON_STATUS_OUT_OF_RANGE, "adam_beta1"),
        (|c| c.adam_beta2 = 1.0, MUON_STATUS_OUT_OF_RANGE, "adam_beta2"),
        (|c| c.adam_eps = 0.0, MUON_STATUS_OUT_OF_RANGE, "adam_eps"),
        (
            |c| c.muon_num_ns_steps = 0,
            MUON_STATUS_OUT_OF_RANGE,
            "muon_num_ns_steps: 0",
        ),
        (
            |c| c.muon_extra_scale_factor = 0.0,
            MUON_STATUS_OUT_OF_RANGE,
            "muon_extra_scale_factor",
        ),
        (|c| c.clip_grad = -1.0, MUON_STATUS_OUT_OF_RANGE, "clip_grad"),
        (
            |c| c.collective_timeout_ms = 0,
            MUON_STATUS_OUT_OF_RANGE,
            "collective_timeout_ms",
        ),
        (
            |c| c.overlap_grad_reduce = 2,
            MUON_STATUS_OUT_OF_RANGE,
            "overlap_grad_reduce: 2 is not a boolean",
        ),
        (|c| c.struct_size = 8, MUON_STATUS_ABI_MISMATCH, "struct_size: 8"),
        (|c| c.abi_version = 10_000 * 7, MUON_STATUS_ABI_MISMATCH, "abi_version"),
    ];
    for (edit, status, needle) in cases {
        let mut cfg = default_config();
        edit(&mut cfg);
        let (got, message) = validate(&cfg);
        assert_eq!(got, status, "{needle}: {message}");
        assert!(message.contains(needle), "'{message}' does not contain '{needle}'");
        assert!(message.starts_with("muon_config_validate: "), "{message}");
    }
}

/// reserved5 fills the 224-byte layout's tail padding (param_sharding's layout ends at 220),
/// muon_custom_coefficient_steps and the 48 floats of the table follow: 424 bytes. An older caller gets no table (a custom set there is refused
/// for want of one); the current layout round-trips the table, and reads only the triples
/// its count names.
#[test]
fn the_custom_coefficient_table_appends_a_layout_of_its_own_size() {
    use crate::config::CoefficientSet;
    assert_eq!(std::mem::offset_of!(muon_config_t, reserved5), 220);
    assert_eq!(std::mem::offset_of!(muon_config_t, muon_custom_coefficient_steps), 224);
    assert_eq!(std::mem::offset_of!(muon_config_t, muon_custom_coefficients), 228);
    assert_eq!(RELEASED_CONFIG_LAYOUTS[10], ("muon_custom_coefficients", 424));
    let mut cfg = default_config();
    cfg.muon_coefficient_set = MUON_COEFFICIENTS_CUSTOM;
    cfg.muon_custom_coefficient_steps = 2;
    cfg.muon_custom_coefficients[..6].copy_from_slice(&[3.0, -3.2, 1.2, 2.0, -1.5, 0.5]);
    cfg.muon_custom_coefficients[6] = f32::NAN;
    let read = unsafe { read_config(&cfg) }.unwrap();
    assert_eq!(read.muon_coefficient_set, CoefficientSet::Custom);
    assert_eq!(read.muon_custom_coefficients, vec![[3.0, -3.2, 1.2], [2.0, -1.5, 0.5]]);
    let back = muon_config_t::from_config(&read);
    assert_eq!(back.muon_custom_coefficient_steps, 2);
    assert_eq!(back.muon_custom_coefficients[..6], cfg.muon_custom_coefficients[..6]);
    assert!(back.muon_custom_coefficients[6..].iter().all(|&v| v == 0.0));
    cfg.struct_size = 224;
    let (status, message) = validate(&cfg);
    assert_eq!(status, MUON_STATUS_OUT_OF_RANGE, "{message}");
    assert!(message.contains("muon_custom_coefficients"), "{message}");
}

/// reserved6 fills the 424-byte layout's tail padding (the table ends at 420),
/// cautious_weight_decay and muon_momentum_dtype follow: 432 bytes. An older caller gets plain
/// weight decay and f32 momentum; the current layout reads both, and a word that is no
/// boolean or no dtype is refused naming its field.
#[test]
fn cautious_weight_decay_and_momentum_dtype_append_a_layout_of_its_own_size() {
    assert_eq!(std::mem::offset_of!(muon_config_t, reserved6), 420);
    assert_eq!(std::mem::offset_of!(muon_config_t, cautious_weight_decay), 424);
    assert_eq!(std::mem::offset_of!(muon_config_t, muon_momentum_dtype), 428);
    assert_eq!(std::mem::size_of::<muon_config_t>(), 432);
    assert_eq!(default_config().muon_momentum_dtype, MUON_DTYPE_F32);
    older_sizes_read_the_default(
        |c, v| c.muon_momentum_dtype = v,
        MUON_DTYPE_BF16,
        |r| r.muon_momentum_dtype == crate::config::Dtype::F32,
        &[424, 224, 208, 192, 144, 104],
    );
    assert_eq!(default_config().cautious_weight_decay, 0);
    older_sizes_read_the_default(
        |c, v| c.cautious_weight_decay = v,
        1,
        |r| !r.cautious_weight_decay,
        &[424, 224, 208, 192, 144, 104],
    );
    let mut cfg = default_config();
    cfg.cautious_weight_decay = 1;
    let read = unsafe { read_config(&cfg) }.unwrap();
    assert!(read.cautious_weight_decay);
    assert_eq!(muon_config_t::from_config(&read).cautious_weight_decay, 1);
    cfg.cautious_weight_decay = 2;
    let (status, message) = validate(&cfg);
    assert_eq!(status, MUON_STATUS_OUT_OF_RANGE, "{message}");
    assert!(
        message.contains("cautious_weight_decay: 2 is not a boolean (0 or 1)"),
        "{message}"
    );
    let mut cfg = default_config();
    cfg.muon_momentum_dtype = 7;
    let (status, message) = validate(&cfg);
    assert_eq!(status, MUON_STATUS_INVALID_ENUM_VALUE, "{message}");
    assert!(message.contains("muon_momentum_dtype"), "{message}");
}

/// The released layouts are the ABI's history: each row's size is its last field's end
/// rounded up to the struct's alignment, the current struct is the last row, and no two rows
/// share a size but the documented host_threads / muon_tp_mode pair — so a field appended into
/// the last layout's tail padding without a reserved word before it fails here.
#[test]
fn every_released_config_layout_has_a_size_of_its_own() {
    use std::mem::offset_of;
    let end = |field: &str| -> usize {
        let word = 4;
        match field {
            "host_comm_mode" => word + offset_of!(muon_config_t, host_comm_mode),
            "host_threads" => word + offset_of!(muon_config_t, host_threads),
            "muon_tp_mode" => word + offset_of!(muon_config_t, muon_tp_mode),
            "muon_ns_eps" => word + offset_of!(muon_config_t, muon_ns_eps),
            "muon_ns_method" => word + offset_of!(muon_config_t, muon_ns_method),
            "muon_ownership" => word + offset_of!(muon_config_t, muon_ownership),
            "weight_decay_rule" => word + offset_of!(muon_config_t, weight_decay_rule),
            "adaptive_muon_eps" => word + offset_of!(muon_config_t, adaptive_muon_eps),
            "param_prefetch_buckets" => word + offset_of!(muon_config_t, param_prefetch_buckets),
            "muon_custom_coefficients" => {
                std::mem::size_of::<[f32; 48]>() + offset_of!(muon_config_t, muon_custom_coefficients)
            }
            "muon_momentum_dtype" => word + offset_of!(muon_config_t, muon_momentum_dtype),
            "expert_network" => std::mem::size_of::<muon_network_t>() + offset_of!(muon_config_t, expert_network),
            other => panic!("no field {other}"),
        }
    };
    let align = std::mem::align_of::<muon_config_t>();
    for (field, size) in RELEASED_CONFIG_LAYOUTS {
        assert_eq!(end(field).next_multiple_of(align), size, "the layout ending at {field}");
    }
    let (last, last_size) = RELEASED_CONFIG_LAYOUTS[RELEASED_CONFIG_LAYOUTS.len() - 1];
    assert_eq!(
        std::mem::size_of::<muon_config_t>(),
        last_size,
        "muon_config_t grew past the {last} layout: add its row to RELEASED_CONFIG_LAYOUTS"
    );
    for pair in RELEASED_CONFIG_LAYOUTS.windows(2) {
        let ((a, a_size), (b, b_size)) = (pair[0], pair[1]);
        let known = (a, b) == ("host_threads", "muon_tp_mode") && a_size == AMBIGUOUS_CONFIG_SIZE;
        assert!(
            b_size > a_size || known,
            "the {a} and {b} layouts are both {b_size} bytes: put a reserved uint32_t before {b}"
        );
    }
    // A caller of an older layout leaves its tail padding unspecified: no later field may live
    // there (each needs a reserved word before it), so junk in that padding reads as zeros do.
    for (field, size) in RELEASED_CONFIG_LAYOUTS {
        if size == AMBIGUOUS_CONFIG_SIZE {
            continue;
        }
        let read = |fill: u8| {
            let mut cfg = default_config();
            cfg.struct_size = size as u32;
            // SAFETY: `end(field)..size` lies inside the struct (size ≤ its size, checked above).
            unsafe {
                let bytes = std::ptr::from_mut(&mut cfg).cast::<u8>();
                std::ptr::write_bytes(bytes.add(end(field)), fill, size - end(field));
            }
            unsafe { read_config(&cfg) }.map_err(|e| e.to_string())
        };
        assert_eq!(
            read(0xAB),
            read(0),
            "the {field} layout's tail padding is read as a field"
        );
    }
    assert_eq!(
        released_config_sizes(),
        [104, 112, 120, 128, 136, 144, 192, 208, 224, 424, 432]
    );
}

/// A 112-byte struct is read as the muon_tp_mode layout; a muon_tp_mode word that is no tp mode
/// (the host_threads layout's padding) is ABI_MISMATCH naming both layouts, not a bad enum.
#[test]
fn the_ambiguous_112_byte_config_refuses_padding_read_as_a_tp_mode() {
    let mut cfg = default_config();
    cfg.struct_size = AMBIGUOUS_CONFIG_SIZE as u32;
    cfg.muon_tp_mode = MUON_TP_MODE_DUPLICATED;
    assert_eq!(validate(&cfg).0, MUON_STATUS_SUCCESS);
    cfg.muon_tp_mode = 0xdead_beef;
    let (status, message) = validate(&cfg);
    assert_eq!(status, MUON_STATUS_ABI_MISMATCH, "{message}");
    assert!(
        message.contains("both the host_threads and the muon_tp_mode layout") && message.contains("3735928559"),
        "{message}"
    );
    cfg.struct_size = std::mem::size_of::<muon_config_t>() as u32;
    assert_eq!(validate(&cfg).0, MUON_STATUS_INVALID_ENUM_VALUE);
}
