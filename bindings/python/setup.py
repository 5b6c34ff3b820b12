"""Builds the package; with ``MUON_OPT_WHEEL_LIB`` set (scripts/build-wheel.sh sets it) the
wheel also carries that libmuon_opt.so and include/muon_opt.h inside ``muon_opt/``, where
``muon_opt._capi.library_candidates()`` finds it, and is tagged for this platform
(``py3-none-<platform>``: the library is native code, the binding is ctypes for any Python 3).
Without it, the package is pure Python and finds an installed library (see README.md)."""

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.bdist_wheel import bdist_wheel

LIB = os.environ.get("MUON_OPT_WHEEL_LIB")
HEADER = Path(__file__).resolve().parents[2] / "include" / "muon_opt.h"


class BuildPy(build_py):
    def run(self):
        super().run()
        if LIB:
            if not Path(LIB).is_file() or not HEADER.is_file():
                raise SystemExit(f"MUON_OPT_WHEEL_LIB={LIB}: no such library, or no {HEADER}")
            target = Path(self.build_lib) / "muon_opt"
            shutil.copy2(LIB, target / "libmuon_opt.so")
            (target / "include").mkdir(exist_ok=True)
            shutil.copy2(HEADER, target / "include" / "muon_opt.h")


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = not LIB

    def get_tag(self):
        python, abi, platform = super().get_tag()
        return ("py3", "none", platform) if LIB else (python, abi, platform)


setup(cmdclass={"build_py": BuildPy, "bdist_wheel": PlatformWheel})
