"""The ctypes mirror (muon_opt._capi) against include/muon_opt.h and the C compiler.

- every #define / enum constant, struct field list (names, order, types) and function
  signature of the header equals the mirror's, and the mirror has nothing the header lacks;
- the checker itself catches each kind of drift (mutated copies of the header);
- sizeof/alignof of every struct, offsetof/sizeof of every field and the value of every
  constant, as `cc` compiles the real header, equal ctypes' numbers.
"""

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import header_mirror as hm  # noqa: E402
from muon_opt import _capi  # noqa: E402

HEADER_TEXT = hm.HEADER.read_text()


class MirrorMatchesHeader(unittest.TestCase):
    def test_every_constant_struct_and_function_matches(self):
        problems = hm.mirror_problems(HEADER_TEXT, _capi)
        self.assertEqual(
            problems,
            [],
            "bindings/python/muon_opt/_capi.py does not follow include/muon_opt.h:\n  " + "\n  ".join(problems),
        )

    def test_parser_sees_the_whole_header(self):
        h = hm.Header(HEADER_TEXT)
        self.assertEqual(h.problems, [])
        # Every MUON_API declaration and every typedef'd struct is parsed, none skipped.
        code = hm.strip_comments(HEADER_TEXT)
        code = re.sub(r"^[ \t]*#[^\n]*$", " ", code, flags=re.M)
        self.assertEqual(len(h.functions), len(re.findall(r"\bMUON_API\b", code)))
        self.assertEqual(len(h.structs), len(re.findall(r"typedef\s+struct\s+\w+\s*\{", code)))
        self.assertIn("MUON_STATUS_PANIC", h.constants)
        self.assertIn("muon_optimizer_step", h.functions)
        self.assertIn("muon_param_view_t", h.structs)


def _mutate(text, old, new):
    assert old in text, old
    return text.replace(old, new, 1)


class CheckerCatchesDrift(unittest.TestCase):
    """A header change the mirror does not follow must fail the test above: each mutation of
    the real header must produce at least one problem naming what changed."""

    def assertDrift(self, text, needle):
        problems = hm.mirror_problems(text, _capi)
        self.assertTrue(any(needle in p for p in problems), f"no problem mentions {needle!r}: {problems}")

    def test_new_struct_field(self):
        self.assertDrift(
            _mutate(HEADER_TEXT, "} muon_param_view_t;", "  uint32_t mxfp8_new_field;\n} muon_param_view_t;"),
            "muon_param_view_t",
        )

    def test_changed_field_type(self):
        text = re.sub(r"float muon_momentum;", "double muon_momentum;", HEADER_TEXT, count=1)
        self.assertNotEqual(text, HEADER_TEXT)
        self.assertDrift(text, "muon_config_t.muon_momentum")

    def test_reordered_fields(self):
        text = re.sub(r"(uint32_t route;)(.*?)(uint32_t bucket;)", r"\3\2\1", HEADER_TEXT, count=1, flags=re.S)
        self.assertNotEqual(text, HEADER_TEXT)
        self.assertDrift(text, "muon_param_view_t")

    def test_new_struct(self):
        self.assertDrift(
            _mutate(
                HEADER_TEXT,
                "#ifdef __cplusplus\nextern",
                "typedef struct muon_new_t {\n  uint32_t x;\n} muon_new_t;\n\n#ifdef __cplusplus\nextern",
            ),
            "struct muon_new_t",
        )

    def test_changed_and_new_define(self):
        self.assertDrift(_mutate(HEADER_TEXT, "#define MUON_MAX_DIMS 4", "#define MUON_MAX_DIMS 5"), "MUON_MAX_DIMS")
        self.assertDrift(
            _mutate(
                HEADER_TEXT, "#define MUON_MAX_DIMS 4", "#define MUON_MAX_DIMS 4\n#define MUON_PARAM_FLAG_NEW (1 << 9)"
            ),
            "MUON_PARAM_FLAG_NEW",
        )

    def test_changed_and_new_status(self):
        self.assertDrift(
            _mutate(HEADER_TEXT, "MUON_STATUS_PANIC = 901", "MUON_STATUS_PANIC = 902"), "MUON_STATUS_PANIC"
        )
        self.assertDrift(
            _mutate(HEADER_TEXT, "MUON_STATUS_PANIC = 901,", "MUON_STATUS_PANIC = 901,\n  MUON_STATUS_NEW = 902,"),
            "MUON_STATUS_NEW",
        )

    def test_changed_function_signature(self):
        text = re.sub(
            r"(muon_optimizer_wait_params\(struct muon_optimizer_t \*opt,\s*)uint32_t bucket",
            r"\1uint64_t bucket",
            HEADER_TEXT,
        )
        self.assertNotEqual(text, HEADER_TEXT)
        self.assertDrift(text, "muon_optimizer_wait_params")

    def test_new_function(self):
        self.assertDrift(
            _mutate(
                HEADER_TEXT,
                "MUON_API\nuint32_t muon_get_version(void);",
                "MUON_API\nuint32_t muon_get_version(void);\n\nMUON_API\nMUON_NODISCARD\n"
                "muon_status_t muon_optimizer_frobnicate(struct muon_optimizer_t *opt, double x);",
            ),
            "muon_optimizer_frobnicate",
        )

    def test_removed_function(self):
        text = re.sub(
            r"MUON_API\s+MUON_NODISCARD\s+muon_status_t muon_optimizer_synchronize\([^;]*\);", "", HEADER_TEXT
        )
        self.assertNotEqual(text, HEADER_TEXT)
        self.assertDrift(text, "muon_optimizer_synchronize")

    def test_changed_checkpoint_signature(self):
        text = re.sub(
            r"(muon_optimizer_save\(struct muon_optimizer_t \*opt,\s*const char \*dir)\)",
            r"\1, uint32_t flags)",
            HEADER_TEXT,
        )
        self.assertNotEqual(text, HEADER_TEXT)
        self.assertDrift(text, "muon_optimizer_save")


def _compiler():
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class LayoutMatchesCCompiler(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cc = _compiler()
        if cc is None:
            if os.environ.get("MUON_REQUIRE_CXX"):
                raise RuntimeError("MUON_REQUIRE_CXX is set but no C compiler (cc) was found")
            raise unittest.SkipTest("no C compiler")
        cls.tmp = tempfile.TemporaryDirectory()
        src = Path(cls.tmp.name) / "layout.c"
        exe = Path(cls.tmp.name) / "layout"
        src.write_text(hm.layout_program(HEADER_TEXT))
        subprocess.run(
            [cc, "-std=c11", "-Wall", "-Werror", "-I", str(hm.HEADER.parent), str(src), "-o", str(exe)],
            check=True,
        )
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
        cls.c = {}
        for line in out.splitlines():
            key, *values = line.split()
            cls.c[key] = tuple(int(v) for v in values)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_struct_size_alignment_and_field_offset(self):
        h = hm.Header(HEADER_TEXT)
        self.assertTrue(h.structs)
        for tag, fields in h.structs.items():
            cls = _capi.STRUCTS[tag]
            with self.subTest(struct=tag):
                self.assertEqual(self.c[tag], (ctypes.sizeof(cls), ctypes.alignment(cls)), f"sizeof/alignof {tag}")
                for fname, _, _ in fields:
                    desc = getattr(cls, fname)
                    self.assertEqual(self.c[f"{tag}.{fname}"], (desc.offset, desc.size), f"{tag}.{fname}")

    def test_every_constant_value(self):
        mirrored = _capi.constants()
        for name in hm.Header(HEADER_TEXT).constants:
            with self.subTest(constant=name):
                self.assertEqual(self.c[name], (mirrored.get(name),))


if __name__ == "__main__":
    unittest.main()
