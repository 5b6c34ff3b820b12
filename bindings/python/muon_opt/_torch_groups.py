"""Param groups of :class:`muon_opt.torch.Muon`: torch's ``param_groups`` mapped onto the
library's step, which multiplies its route's learning rate and weight decay (Muon, AdamW) by
each param's ``lr_scale`` / ``wd_scale`` (``muon_optimizer_set_param_scales``).

A group's ``lr`` and ``weight_decay`` are what a ``torch.optim.lr_scheduler`` drives, each group
on its own schedule: the step passes lr = weight decay = 1 and gives every param its group's
current rates times the group's own ``lr_scale`` / ``wd_scale`` as its scales (``1 · rate`` is
the rate's f32 bits, so the update is the one the rate in the step args would give).
``momentum`` / ``nesterov`` (Muon) and ``betas`` / ``eps`` (AdamW), in every group, are the
config's, fixed at construction, and refused when changed.
"""

import ctypes
import math

GROUP_KEYS = {"params", "use_muon", "lr", "weight_decay", "lr_scale", "wd_scale", "name"}


def _f32(value):
    return ctypes.c_float(value).value


def fixed_values(config):
    """The group entries the config fixes (every group carries all of them, as torch's
    defaults, so schedulers that look for ``momentum`` or ``betas`` find them)."""
    return {"momentum": _f32(config.muon_momentum), "nesterov": bool(config.muon_nesterov),
            "betas": (_f32(config.adam_beta1), _f32(config.adam_beta2)), "eps": _f32(config.adam_eps)}


def normalize(param_groups, named, defaults):
    """The caller's groups as dicts of every key, each param (by id) in exactly one group.
    ``defaults[use_muon]`` gives the ``lr`` and ``weight_decay`` a group leaves out."""
    name_of = {id(p): name for name, p in named}
    by_name = {name: p for name, p in named}
    groups, group_of = [], {}
    for i, spec in enumerate(param_groups):
        if not isinstance(spec, dict):
            raise TypeError(f"param_groups[{i}]: expected a dict, got {type(spec).__name__}")
        unknown = set(spec) - GROUP_KEYS
        if unknown:
            raise ValueError(f"param_groups[{i}]: unknown keys {sorted(unknown)}; a group takes {sorted(GROUP_KEYS)}")
        if not isinstance(spec.get("use_muon"), bool):
            raise ValueError(f"param_groups[{i}]['use_muon']: required, True (Muon) or False (AdamW)")
        use_muon = spec["use_muon"]
        group = dict(defaults[use_muon], lr_scale=1.0, wd_scale=1.0)
        group.update({k: v for k, v in spec.items() if k != "params"})
        for key in ("lr", "weight_decay", "lr_scale", "wd_scale"):
            value = group[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"param_groups[{i}]['{key}']: must be a finite number >= 0, got {value!r}")
        params = []
        for p in spec.get("params", ()):
            if isinstance(p, str):
                if p not in by_name:
                    raise ValueError(f"param_groups[{i}]['params']: '{p}' names no parameter of the module")
                p = by_name[p]
            if id(p) not in name_of:
                raise ValueError(f"param_groups[{i}]['params']: a tensor that is not a parameter of the module")
            if id(p) in group_of:
                raise ValueError(
                    f"param_groups[{i}]['params']: '{name_of[id(p)]}' is already in param_groups[{group_of[id(p)]}]"
                )
            group_of[id(p)] = i
            params.append(p)
        group["params"] = params
        groups.append(group)
    missing = [name for name, p in named if id(p) not in group_of]
    if missing:
        raise ValueError(f"param_groups: every parameter must be in one group; in none: {missing}")
    return groups, group_of


def rates(group):
    """A group's (lr, weight_decay) as its params' library scales: its rates times its own
    ``lr_scale`` / ``wd_scale``, rounded to f32 as the library keeps them."""
    return _f32(group["lr"] * group["lr_scale"]), _f32(group["weight_decay"] * group["wd_scale"])


def check_fixed(groups, fixed):
    """ValueError naming the first group whose momentum / betas / eps differ from the config."""
    for i, group in enumerate(groups):
        for key, want in fixed.items():
            got = group.get(key)
            same = (
                tuple(_f32(v) for v in got) == want
                if isinstance(want, tuple) and isinstance(got, (tuple, list))
                else (got == want if isinstance(want, bool) else isinstance(got, (int, float)) and _f32(got) == want)
            )
            if not same:
                raise ValueError(
                    f"param_groups[{i}]['{key}'] is {got!r}, but the library fixes it at construction "
                    f"({want!r}, from the config); a scheduler that cycles momentum (OneCycleLR, CyclicLR) "
                    "needs cycle_momentum=False"
                )
