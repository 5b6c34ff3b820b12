"""Param groups of :class:`muon_opt.torch.Muon`: torch's ``param_groups`` mapped onto the
library's step, which multiplies its route's learning rate and weight decay (Muon, AdamW) by
each param's ``lr_scale`` / ``wd_scale`` (``muon_optimizer_set_param_scales``) and takes the
route's momentum and betas from the step's arguments (``muon_step_args_t.overrides``).

A group's ``lr`` and ``weight_decay`` are what a ``torch.optim.lr_scheduler`` drives, each group
on its own schedule: the step passes lr = weight decay = 1 and gives every param its group's
current rates times the group's own ``lr_scale`` / ``wd_scale`` as its scales (``1 · rate`` is
the rate's f32 bits, so the update is the one the rate in the step args would give).

Momentum and betas are read at every step too: the Muon groups' ``momentum`` is the step's Muon
momentum, the AdamW groups' ``betas`` and ``eps`` its AdamW β1, β2 and ε (AdamW's bias
corrections are then ``1 - β**t`` with the step's β, torch.optim.AdamW's convention). The
library steps every param of a route with one value, so the groups of a route must agree
(ValueError naming two that differ). In every group ``momentum`` and ``betas[0]`` are one value,
the group's first-moment coefficient (Muon's μ, AdamW's β1), as torch's schedulers treat them:
OneCycleLR and CyclicLR with ``cycle_momentum=True`` cycle ``betas[0]`` here (the optimizer's
defaults carry ``betas``), a Muon momentum warmup sets ``momentum``. The step takes the one
that changed since the last step — the route's own (``momentum`` for Muon, ``betas[0]`` for
AdamW) when both did — and sets the other to it. A Muon group's ``betas[1]`` and ``eps`` are
not used. ``nesterov`` is the config's, fixed at construction.
"""

import ctypes
import math

GROUP_KEYS = {"params", "use_muon", "lr", "weight_decay", "lr_scale", "wd_scale", "name"}


def _f32(value):
    return ctypes.c_float(value).value


def optimizer_defaults(config):
    """The optimizer's defaults: the config's momentum, Nesterov, betas and ε (every group
    carries these keys, so schedulers that look for ``momentum`` or ``betas`` find them)."""
    return {"momentum": _f32(config.muon_momentum), "nesterov": bool(config.muon_nesterov),
            "betas": (_f32(config.adam_beta1), _f32(config.adam_beta2)), "eps": _f32(config.adam_eps)}


def group_values(config, use_muon):
    """The momentum entries a group of the route starts with: its first-moment coefficient
    (the config's Muon momentum, or AdamW β1) as both ``momentum`` and ``betas[0]``."""
    values = optimizer_defaults(config)
    first = values["momentum"] if use_muon else values["betas"][0]
    return dict(values, momentum=first, betas=(first, values["betas"][1]))


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


def check_nesterov(groups, nesterov):
    """ValueError naming the first group whose ``nesterov`` differs from the config's."""
    for i, group in enumerate(groups):
        if group.get("nesterov") != nesterov:
            raise ValueError(
                f"param_groups[{i}]['nesterov'] is {group.get('nesterov')!r}, but the library fixes it at "
                f"construction ({nesterov!r}, config.muon_nesterov)"
            )


def _real(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _betas(i, group):
    betas = group.get("betas")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2 or not all(_real(b) for b in betas):
        raise ValueError(f"param_groups[{i}]['betas']: expected (beta1, beta2), two numbers; got {betas!r}")
    return betas


def first_moments(groups):
    """Each group's ``momentum``: what :func:`sync_first_moments` compares with."""
    return [group["momentum"] for group in groups]


def sync_first_moments(groups, seen):
    """Makes ``momentum`` and ``betas[0]`` of every group one value (see the module's
    docstring); ``seen`` holds each group's value at the last step. Returns the values now."""
    now = []
    for i, group in enumerate(groups):
        momentum, betas = group.get("momentum"), _betas(i, group)
        if not _real(momentum):
            raise ValueError(f"param_groups[{i}]['momentum']: expected a number, got {momentum!r}")
        value = momentum if group["use_muon"] else betas[0]
        if momentum != betas[0]:
            other = betas[0] if group["use_muon"] else momentum
            if value == seen[i]:
                value = other
            group["momentum"], group["betas"] = value, type(betas)((value, betas[1]))
        now.append(value)
    return now


def _unit(label, value):
    if not (_real(value) and 0 <= value < 1):
        raise ValueError(f"{label} is {value!r}; it must be in [0, 1)")


def _positive(label, value):
    if not (_real(value) and math.isfinite(value) and value > 0):
        raise ValueError(f"{label} is {value!r}; it must be finite and > 0")


def _route_value(groups, use_muon, key, index, check):
    """The f32 value of ``key`` (its element ``index``) shared by every group of the route, or
    None without one; ValueError naming a group whose value is out of range or differs."""
    first = None
    for i, group in enumerate(groups):
        if group["use_muon"] != use_muon:
            continue
        value = group[key] if index is None else group[key][index]
        label = f"param_groups[{i}]['{key}']" + ("" if index is None else f"[{index}]")
        check(label, value)
        if first is None:
            first = (label, value)
        elif _f32(value) != _f32(first[1]):
            route = "Muon" if use_muon else "AdamW"
            raise ValueError(
                f"{label} is {value!r} but {first[0]} is {first[1]!r}: the library steps every {route} param "
                f"with one value (a step's override is per route); give the {route} groups one '{key}', "
                "e.g. one schedule for all of them"
            )
    return None if first is None else _f32(first[1])


def step_overrides(groups):
    """The step's overrides of the config (``muon_opt.Optimizer.step`` keywords): the Muon
    groups' momentum, the AdamW groups' betas and ε (None for a route without groups)."""
    return {
        "muon_momentum": _route_value(groups, True, "momentum", None, _unit),
        "adam_beta1": _route_value(groups, False, "betas", 0, _unit),
        "adam_beta2": _route_value(groups, False, "betas", 1, _unit),
        "adam_eps": _route_value(groups, False, "eps", None, _positive),
    }
