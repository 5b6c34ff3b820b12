"""Parses include/muon_opt.h and compares it with the ctypes mirror in muon_opt._capi.

The parser knows only the shapes cbindgen writes (object-like #defines, one enum with explicit
or implicit values, `typedef struct NAME { ... } NAME;`, and `MUON_API [MUON_NODISCARD] ret
name(args);` prototypes). Anything it does not understand is reported rather than skipped, so
a new kind of declaration makes the test fail until this file and the mirror learn it.
"""

import ast
import ctypes
import os
import re
from ctypes import POINTER
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
HEADER = Path(os.environ.get("MUON_OPT_HEADER", REPO / "include" / "muon_opt.h"))

# Macros that are not values: the include guard, the attribute/visibility macros and the
# brace initializer (its defaults are what muon_config_init() writes, which the binding calls).
NON_VALUE_MACROS = {"MUON_OPT_H", "MUON_API", "MUON_NODISCARD", "MUON_CONFIG_INIT"}

# Types that cross the ABI as plain addresses (c_void_p) in the mirror.
VOID_POINTER_STRUCTS = {"CUstream_st", "ncclComm"}

SCALARS = {
    "uint8_t": ctypes.c_uint8,
    "uint16_t": ctypes.c_uint16,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "int8_t": ctypes.c_int8,
    "int16_t": ctypes.c_int16,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "bool": ctypes.c_bool,
    "size_t": ctypes.c_size_t,
    "char": ctypes.c_char,
}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _join_continuations(text):
    return re.sub(r"\\\n", " ", text)


def _eval_int(expr, known):
    """Integer value of a C constant expression (literals, names, + - * << >> | & ~, parens)."""
    expr = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b", r"\1", expr.strip())
    tree = ast.parse(expr, mode="eval")

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in known:
            return known[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Invert, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else (~v if isinstance(node.op, ast.Invert) else v)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {
                ast.Add: lambda: a + b,
                ast.Sub: lambda: a - b,
                ast.Mult: lambda: a * b,
                ast.LShift: lambda: a << b,
                ast.RShift: lambda: a >> b,
                ast.BitOr: lambda: a | b,
                ast.BitAnd: lambda: a & b,
            }
            for op, fn in ops.items():
                if isinstance(node.op, op):
                    return fn()
        raise ValueError(f"not an integer constant expression: {expr!r}")

    return ev(tree)


class Header:
    """What the header declares: constants, structs (ordered field lists), functions."""

    def __init__(self, text):
        self.problems = []  # declarations the parser did not understand
        self.constants = {}
        self.structs = {}  # name -> [(field, type spelling, array length expr or None)]
        self.functions = {}  # name -> (return type spelling, [arg type spellings])
        self.opaque = set()
        code = _join_continuations(strip_comments(text))
        self._parse_defines(code)
        declarations = re.sub(r"^[ \t]*#[^\n]*$", " ", code, flags=re.M)  # preprocessor lines
        self._parse_enums(declarations)
        self._parse_structs(declarations)
        self._parse_functions(declarations)

    def _parse_defines(self, code):
        for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\([^)]*\))?[ \t]*(.*)$", code, flags=re.M):
            name, fn_like, value = m.group(1), m.group(2), m.group(3).strip()
            if name in NON_VALUE_MACROS:
                continue
            if fn_like:
                self.problems.append(f"function-like macro {name} is not mirrored")
                continue
            try:
                self.constants[name] = _eval_int(value, self.constants)
            except (ValueError, SyntaxError):
                self.problems.append(f"#define {name} {value!r} is not an integer constant")

    def _parse_enums(self, code):
        for m in re.finditer(r"\benum\s+(\w+)[^{;]*\{([^}]*)\}\s*;", code):
            nxt = 0
            for item in (s.strip() for s in m.group(2).split(",")):
                if not item:
                    continue
                name, _, value = (p.strip() for p in item.partition("="))
                if not re.fullmatch(r"\w+", name):
                    self.problems.append(f"enum {m.group(1)}: cannot parse {item!r}")
                    continue
                try:
                    nxt = _eval_int(value, self.constants) if value else nxt
                except (ValueError, SyntaxError):
                    self.problems.append(f"enum {m.group(1)}: {item!r} is not an integer constant")
                    continue
                self.constants[name] = nxt
                nxt += 1

    def _parse_structs(self, code):
        for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", code, flags=re.S):
            tag, body, alias = m.groups()
            if tag != alias:
                self.problems.append(f"struct {tag} is typedef'd as {alias}")
            fields = []
            for decl in (d.strip() for d in body.split(";")):
                if not decl:
                    continue
                fm = re.fullmatch(r"(.+?)\s*\b(\w+)\s*(?:\[\s*(\w+)\s*\])?", decl, flags=re.S)
                if not fm or "(" in decl or "," in decl or ":" in decl:
                    self.problems.append(f"struct {tag}: cannot parse field {decl!r}")
                    continue
                fields.append((fm.group(2), normalize_type(fm.group(1)), fm.group(3)))
            self.structs[tag] = fields
        for m in re.finditer(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", code):
            self.opaque.add(m.group(1))

    def _parse_functions(self, code):
        for m in re.finditer(r"\bMUON_API\b(.*?);", code, flags=re.S):
            decl = re.sub(r"\bMUON_NODISCARD\b", " ", m.group(1))
            fm = re.fullmatch(r"\s*(.+?)\b(\w+)\s*\((.*)\)\s*", decl, flags=re.S)
            if not fm:
                self.problems.append(f"cannot parse prototype {decl.strip()!r}")
                continue
            ret, name, args = fm.groups()
            arg_types = []
            args = args.strip()
            if args and args != "void":
                for a in args.split(","):
                    am = re.fullmatch(r"\s*(.+?)\s*\b(\w+)\s*", a, flags=re.S)
                    if not am or "[" in a or "(" in a:
                        self.problems.append(f"{name}: cannot parse argument {a.strip()!r}")
                        continue
                    arg_types.append(normalize_type(am.group(1)))
            self.functions[name] = (normalize_type(ret), arg_types)


def normalize_type(spelling):
    s = re.sub(r"\s+", " ", spelling.replace("*", " * ")).strip()
    return s.replace("* *", "**")


def ctype_for(spelling, capi, array_len=None, constants=None):
    """The ctypes type a C type spelling must be mirrored as (the rules of the mirror)."""
    s = spelling.split()
    const = "const" in s
    s = [t for t in s if t != "const"]
    stars = sum(t.count("*") for t in s)
    base = [t for t in s if "*" not in t]
    if base[:1] == ["struct"] or base[:1] == ["enum"]:
        base = base[1:]
    if len(base) != 1:
        raise KeyError(spelling)
    base = base[0]
    if base == "void":
        t = None
    elif base == "muon_status_t":
        t = capi.muon_status_t
    elif base in SCALARS:
        t = SCALARS[base]
    elif base in VOID_POINTER_STRUCTS:
        if stars != 1:
            raise KeyError(spelling)
        return ctypes.c_void_p
    elif hasattr(capi, base):
        t = getattr(capi, base)
    else:
        raise KeyError(spelling)
    if stars:
        if base == "void" and stars == 1:
            t = ctypes.c_void_p
        elif base == "char" and stars == 1:
            t = ctypes.c_char_p if const else POINTER(ctypes.c_char)
        else:
            t = POINTER(t)
        for _ in range(stars - 1):
            t = POINTER(t)
    if array_len is not None:
        n = int(array_len) if array_len.isdigit() else (constants or {})[array_len]
        t = t * n
    return t


def _same_type(a, b):
    if a is b:
        return True
    # Arrays are created per use (c_int64 * 4 twice gives two classes): compare element and length.
    if hasattr(a, "_length_") and hasattr(b, "_length_"):
        return a._length_ == b._length_ and _same_type(a._type_, b._type_)
    return False


def _name(t):
    return "void" if t is None else getattr(t, "__name__", repr(t))


def mirror_problems(header_text, capi):
    """Every difference between the header and the mirror, as readable lines (empty = none)."""
    h = Header(header_text)
    out = list(h.problems)

    mirrored = capi.constants()
    for name, value in sorted(h.constants.items()):
        if name not in mirrored:
            out.append(f"constant {name} = {value} is missing from the mirror")
        elif mirrored[name] != value:
            out.append(f"constant {name}: header {value}, mirror {mirrored[name]}")
    for name in sorted(set(mirrored) - set(h.constants)):
        out.append(f"constant {name} is in the mirror but not in the header")

    for tag, fields in h.structs.items():
        cls = capi.STRUCTS.get(tag)
        if cls is None:
            out.append(f"struct {tag} is missing from the mirror")
            continue
        mine = list(cls._fields_)
        if [f[0] for f in fields] != [f[0] for f in mine]:
            out.append(f"struct {tag}: header fields {[f[0] for f in fields]}, mirror {[f[0] for f in mine]}")
            continue
        for (fname, spelling, arr), (_, mtype) in zip(fields, mine):
            try:
                want = ctype_for(spelling, capi, arr, h.constants)
            except KeyError:
                out.append(f"struct {tag}.{fname}: no mirror rule for C type {spelling!r}")
                continue
            if not _same_type(want, mtype):
                out.append(f"struct {tag}.{fname}: C {spelling!r} needs {_name(want)}, mirror has {_name(mtype)}")
    for tag in sorted(set(capi.STRUCTS) - set(h.structs)):
        out.append(f"struct {tag} is in the mirror but not in the header")

    for tag in sorted(h.opaque):
        if not hasattr(capi, tag):
            out.append(f"opaque type {tag} is missing from the mirror")

    for name, (ret, args) in sorted(h.functions.items()):
        proto = capi.PROTOTYPES.get(name)
        if proto is None:
            out.append(f"function {name} is missing from the mirror's PROTOTYPES")
            continue
        try:
            want = (ctype_for(ret, capi), [ctype_for(a, capi) for a in args])
        except KeyError as e:
            out.append(f"function {name}: no mirror rule for C type {e.args[0]!r}")
            continue
        if want[0] is not proto[0]:
            out.append(f"function {name}: returns {ret!r} ({_name(want[0])}), mirror {_name(proto[0])}")
        if len(want[1]) != len(proto[1]) or not all(a is b for a, b in zip(want[1], proto[1])):
            out.append(
                f"function {name}: header args {args} = {[_name(t) for t in want[1]]}, "
                f"mirror {[_name(t) for t in proto[1]]}"
            )
    for name in sorted(set(capi.PROTOTYPES) - set(h.functions)):
        out.append(f"function {name} is in the mirror but not in the header")
    return out


def layout_program(header_text):
    """C source printing sizeof/alignof of every struct, offsetof/sizeof of every field, and
    the value of every constant, one `key value` line each."""
    h = Header(header_text)
    lines = [
        "#include <stddef.h>",
        "#include <stdio.h>",
        '#include "muon_opt.h"',
        "int main(void) {",
    ]
    for tag, fields in h.structs.items():
        lines.append(f'    printf("{tag} %zu %zu\\n", sizeof({tag}), (size_t)_Alignof({tag}));')
        for fname, _, _ in fields:
            lines.append(
                f'    printf("{tag}.{fname} %zu %zu\\n", offsetof({tag}, {fname}), sizeof((({tag} *)0)->{fname}));'
            )
    for name in h.constants:
        lines.append(f'    printf("{name} %lld\\n", (long long)({name}));')
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"
