#!/usr/bin/env python3
"""Writes tests/data/megatron_flags.json: Megatron-LM's Muon flags with their defaults, the
snapshot tests/megatron_flags.rs compares docs/megatron.md with.

    python3 scripts/megatron_flags.py MEGATRON_GIT_DIR [COMMIT] > tests/data/megatron_flags.json

MEGATRON_GIT_DIR is a clone of NVIDIA/Megatron-LM (a bare one does: files are read with
``git show COMMIT:PATH``); COMMIT defaults to HEAD. The snapshot holds every flag of
``megatron/training/arguments.py`` named ``--muon-*`` or ``--qk-clip*`` (those the
``TransformerConfig`` fields ``qk_clip*`` become through ``ArgumentGroupFactory``, whose rule is
``"--" + name.replace("_", "-")``, a bool defaulting to True prefixed ``no-``), and the flags
the Muon mapping also covers (EXTRA). Each flag's default is written as the table writes it: a
number or string as argparse holds it, ``off`` for a flag that is absent unless given
(``store_true``, ``store_false``), ``None`` for no default; ``--optimizer`` lists its choices.
"""

import ast
import json
import subprocess
import sys

ARGUMENTS = "megatron/training/arguments.py"
TRANSFORMER_CONFIG = "megatron/core/transformer/transformer_config.py"
PREFIXES = ("--muon-", "--qk-clip")
EXTRA = ("--optimizer", "--weight-decay", "--apply-wd-to-qk-layernorm", "--decoupled-lr", "--decoupled-min-lr")


def show(repo, commit, path):
    return subprocess.run(
        ["git", "-C", repo, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def text(value):
    """A default as the table's 'Megatron default' column states it."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def wanted(flag):
    return flag.startswith(PREFIXES) or flag in EXTRA


def argparse_flags(source):
    """(flag, default, choices) of every wanted ``add_argument('--…', …)`` call."""
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
            continue
        if not (node.args and isinstance(node.args[0], ast.Constant) and wanted(str(node.args[0].value))):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        action = keywords.get("action")
        if isinstance(action, ast.Constant) and action.value in ("store_true", "store_false"):
            default = "off"
        elif "default" in keywords:
            default = text(ast.literal_eval(keywords["default"]))
        else:
            default = "None"
        choices = ast.literal_eval(keywords["choices"]) if "choices" in keywords else None
        yield node.args[0].value, default, choices


def dataclass_flags(source, cls, field_prefix):
    """(flag, default, None) of the fields of dataclass ``cls`` named ``field_prefix*``, under
    ArgumentGroupFactory's naming rule."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and item.target.id.startswith(field_prefix):
                    value = ast.literal_eval(item.value)
                    name = ("no_" if value is True else "") + item.target.id
                    yield "--" + name.replace("_", "-"), "off" if isinstance(value, bool) else text(value), None


def main():
    repo = sys.argv[1]
    commit = subprocess.run(
        ["git", "-C", repo, "rev-parse", sys.argv[2] if len(sys.argv) > 2 else "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    found = {}
    for path, flags in (
        (ARGUMENTS, argparse_flags(show(repo, commit, ARGUMENTS))),
        (TRANSFORMER_CONFIG, dataclass_flags(show(repo, commit, TRANSFORMER_CONFIG), "TransformerConfig", "qk_clip")),
    ):
        for flag, default, choices in flags:
            if wanted(flag):
                entry = {"flag": flag, "default": default, "file": path}
                if choices is not None and flag == "--optimizer":
                    entry["choices"] = list(choices)
                found[flag] = entry
    date = subprocess.run(
        ["git", "-C", repo, "show", "-s", "--format=%cI", commit], check=True, capture_output=True, text=True
    ).stdout.strip()
    snapshot = {
        "source": "https://github.com/NVIDIA/Megatron-LM",
        "commit": commit,
        "commit_date": date,
        "files": [ARGUMENTS, TRANSFORMER_CONFIG],
        "generated_by": "scripts/megatron_flags.py",
        "flags": sorted(found.values(), key=lambda e: e["flag"]),
    }
    json.dump(snapshot, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
