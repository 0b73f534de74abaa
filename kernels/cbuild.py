"""Build a kernel C file on first use and load it by ctypes (the CPU kernels: ``ckks_cpu``,
``llama_cpu``, ``rounding_cpu``, ``bitpack_cpu``).

The file is compiled once per (source, compiler, flags, CPU) with the system C compiler
(``$CC``, else ``cc`` or ``gcc``; Triton and Inductor need one too) into ``$VEIL_KERNEL_CACHE``
(default ``~/.cache/veil/kernels``), written under a temporary name and renamed, so concurrent
builders never load a half-written library. No compiler, a failed build or
``VEIL_CPU_KERNELS=0``: the caller's torch twins run. Libraries built for this CPU
(``native=True``: ``-march=native``) carry the CPU's flags in their cache key, so a cache shared
by different machines never hands one of them another CPU's instructions.

OpenMP: the library names ``libgomp.so.1``, which resolves to the copy torch has already
loaded, so the kernels' parallel loops run on the calling thread's torch team (its
``torch.set_num_threads``), never on a second team that would compete with it for the cores.
Without OpenMP the loops run on the calling thread alone. ctypes releases the GIL during
each call.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["enabled", "load"]

log = logging.getLogger(__name__)


def enabled() -> bool:
    """``VEIL_CPU_KERNELS=0`` keeps the torch twins on the CPU (benchmarks compare both)."""
    return os.environ.get("VEIL_CPU_KERNELS", "1") != "0"


def _cache_dir() -> Path:
    return Path(os.environ.get("VEIL_KERNEL_CACHE") or Path.home() / ".cache" / "veil" / "kernels")


@functools.cache
def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _compile(cc: str, source: Path, flags: tuple[str, ...], out: Path) -> None:
    base = [cc, *flags, "-o", str(out), str(source)]
    try:
        subprocess.run(base + ["-fopenmp"], check=True, capture_output=True, timeout=120)
    except subprocess.CalledProcessError:
        log.warning("the C compiler has no OpenMP: %s runs on one thread", source.name)
        subprocess.run(base, check=True, capture_output=True, timeout=120)


def load(source: Path, flags: tuple[str, ...], *, native: bool = False) -> ctypes.CDLL | None:
    """The compiled ``source`` (``-shared -fPIC`` added; ``native`` adds ``-march=native``), or
    None (and one log line) where it cannot be built."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("no C compiler: %s is not built, the torch twins run on the CPU", source.name)
        return None
    flags = (*flags, "-shared", "-fPIC", *(("-march=native",) if native else ()))
    key = source.read_bytes() + " ".join((cc, *flags)).encode() + (_cpu_flags().encode() if native else b"")
    out = _cache_dir() / f"{source.stem}-{hashlib.sha256(key).hexdigest()[:16]}.so"
    try:
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
                part = Path(tmp) / out.name
                _compile(cc, source, flags, part)
                os.replace(part, out)
        return ctypes.CDLL(str(out))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("building %s failed (%s): the torch twins run instead", source.name, e)
        return None
