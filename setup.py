"""The compiled codec (mqstore.codec: Cython extension modules), built by the package's own build.

Everything else about the package is in pyproject.toml; setuptools cannot declare extension modules
there conditionally, hence this file. The build of the extensions is optional: without Cython, a C
compiler or zlib.h, or if compiling fails, the package still installs (pip prints the reason as a
warning) and runs on the pure-Python codec, which it then logs once at start (``codec.pure_python``).
``MQSTORE_REQUIRE_COMPILED=1`` makes such a failure fatal instead (the Docker image's build sets it).
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

CODEC_DIR = "core/mqstore/codec"
MODULES = ("_request", "_records", "_responses", "_scan", "_stamp", "_index", "_replay", "_offset_map")
REQUIRE = os.environ.get("MQSTORE_REQUIRE_COMPILED", "") not in ("", "0")


def _say(message: str) -> None:
    print(f"mqstore setup: {message}", file=sys.stderr)


def extensions() -> list:
    try:
        from Cython.Build import cythonize
    except ImportError as exc:
        if REQUIRE:
            raise
        _say(f"WARNING: Cython is not installed ({exc}); the pure-Python codec will be used")
        return []
    from setuptools import Extension
    # _crc.h: the records' CRC-32 (zlib's values; folded with PCLMULQDQ on x86-64 CPUs that have it)
    modules = [Extension(f"mqstore.codec.{name}", [f"{CODEC_DIR}/{name}.pyx"], libraries=["z"],
                         include_dirs=[CODEC_DIR], depends=[f"{CODEC_DIR}/_crc.h"]) for name in MODULES]
    try:
        return cythonize(modules, compiler_directives={"language_level": 3}, quiet=True)
    except Exception as exc:  # a .pyx that does not translate: no compiled codec either
        if REQUIRE:
            raise
        _say(f"WARNING: Cython could not translate the codec ({exc}); the pure-Python codec will be used")
        return []


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing, unless MQSTORE_REQUIRE_COMPILED is set."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure to build means: no compiled codec
            self._give_up(exc)

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - e.g. CompileError, LinkError: as above
            self._give_up(exc)

    def _give_up(self, exc: Exception) -> None:
        if REQUIRE:
            raise exc
        _say(f"WARNING: the compiled codec did not build ({type(exc).__name__}: {exc}); the package "
             f"installs without it and runs on the pure-Python codec")


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
