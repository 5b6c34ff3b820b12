"""The row count a QK-clip head layout implies, checked in Python where a layout is declared.

The rule is the library's (``QkHeads::row_map`` in ``src/numerics/qk_clip.rs``, described at
``MUON_QK_KIND_*`` in ``include/muon_opt.h``); the library checks it again at
``muon_optimizer_qk_clip``. Checking it here makes a wrong layout fail where it is written
(``Muon(qk_clip=...)``) instead of at the first step.
"""

from ._capi import constants

_KINDS = {v: k[len("MUON_QK_KIND_") :].lower() for k, v in constants().items() if k.startswith("MUON_QK_KIND_")}


def expected_rows(where, kind, num_heads, head_dim, num_query_groups=0, rope_dim=0, v_head_dim=0):
    """Rows of the matrix the layout describes; ValueError naming ``where`` and the field."""
    name = _KINDS.get(kind)
    if name is None:
        raise ValueError(f"{where}: kind {kind!r} is no MUON_QK_KIND_* value")
    for field, value in (("num_heads", num_heads), ("head_dim", head_dim)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}: {field} must be a positive integer, got {value!r}")
    groups = num_query_groups or num_heads
    if name in ("fused_qkv", "query", "key"):
        if not isinstance(groups, int) or groups <= 0 or num_heads % groups:
            raise ValueError(
                f"{where}: num_query_groups {num_query_groups} does not divide num_heads {num_heads} "
                "(GQA: every query group has the same number of heads)"
            )
        per_group = {"fused_qkv": num_heads // groups * head_dim + 2 * head_dim,
                     "query": num_heads // groups * head_dim, "key": head_dim}[name]
        return groups * per_group
    extra, field = (rope_dim, "rope_dim") if name == "mla_query" else (v_head_dim, "v_head_dim")
    if not isinstance(extra, int) or extra <= 0:
        raise ValueError(f"{where}: {field} must be a positive integer for kind {name}, got {extra!r}")
    return num_heads * (head_dim + extra)


def check_maxima_count(where, num_heads, count):
    """A layout of ``num_heads`` heads reads exactly ``num_heads`` maxima."""
    if count != num_heads:
        raise ValueError(f"{where}: max_logits has {count} values, the layout has num_heads {num_heads} (one per head)")
