"""NVRTC: CUDA C source -> cubin for one arch, cached on disk; cubin -> kernels on the GPU.

We compile to cubin (machine code for exactly that arch), never PTX: PTX from an NVRTC newer than the driver
cannot be JIT-compiled by it, while a cubin for sm_90 runs on any driver that knows sm_90.
The cache key is everything that can change the machine code: the source, the headers it can include (our
kernels/*.cuh and every header of the toolkit's include folder), the options, the arch and the NVRTC version. So a cubin is
found only for byte-identical inputs: an edited kernel, header or define, another GPU generation or another NVRTC
misses and compiles afresh, and no stale cubin can be loaded. Stages whose kernel files are copies share one
cubin. The folder ($TINY_VLLM_KERNEL_CACHE, default the cache root's kernels/) can be copied to another machine.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

CUDA_STD = "c++17"


class KernelCompileError(RuntimeError):
    """A .cu file failed to compile; the message names the file and carries the NVRTC log."""


def cache_root() -> Path:
    """Where compiled kernels and generated checkpoints live: $TINY_VLLM_CACHE or ~/.cache/tiny-vllm."""
    return Path(os.environ.get("TINY_VLLM_CACHE", Path.home() / ".cache" / "tiny-vllm"))


def kernel_cache() -> Path:
    """Where compiled cubins live: $TINY_VLLM_KERNEL_CACHE, or kernels/ under the cache root. A folder of its own
    so that it can travel without the checkpoints beside it (scripts/gpu_check.sh carries it from run to run)."""
    return Path(os.environ.get("TINY_VLLM_KERNEL_CACHE", cache_root() / "kernels"))


@functools.cache
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KernelCompileError(f"NVRTC is not usable: {err.name}")
    return f"{major}.{minor}"


@functools.cache
def cuda_include_dir() -> str:
    """The toolkit headers (cuda_bf16.h) from the nvidia-cuda-runtime wheel, or a system CUDA."""
    import cuda.pathfinder

    found = cuda.pathfinder.find_nvidia_header_directory("cudart")
    if found is None:
        raise KernelCompileError("cuda_bf16.h not found: install the CUDA runtime headers "
                                 "(pip install 'cuda-toolkit[cudart]') or set CUDA_HOME")
    return str(found)


@functools.cache
def _toolkit_header_digest() -> str:
    """Every header of the toolkit's include folder (about 100 files, 5 MB: cuda_bf16.h and what it includes),
    hashed once a process: a kernel's machine code can change with any of them."""
    inc = Path(cuda_include_dir())
    h = hashlib.sha256()
    for path in sorted(p for p in inc.rglob("*") if p.is_file()):
        h.update(path.relative_to(inc).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(source: str, headers: dict[str, str], options: tuple[str, ...], arch: str) -> str:
    h = hashlib.sha256()
    for part in (source, *(f"{k}\0{v}" for k, v in sorted(headers.items())), *options, arch,
                 nvrtc_version(), _toolkit_header_digest()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def arch_for(path: Path, arch: str) -> str:
    """The target to compile the kernel file `path` for on a GPU of `arch` ("sm_90"): sm_90a where the file's first
    line names it (its kernels use Hopper's arch-specific instructions, wgmma and TMA, which sm_90 code may not;
    a cubin for sm_90a runs on compute capability 9.0 alone), else `arch`."""
    first = Path(path).read_text().split("\n", 1)[0]
    return "sm_90a" if arch == "sm_90" and "sm_90a" in first else arch


def compile_cubin(path: Path, arch: str, defines: tuple[str, ...] = ()) -> bytes:
    """Compile one .cu file to a cubin for `arch` (e.g. "sm_90"); works without a GPU.

    `defines` are NAME or NAME=VALUE macros. Raises KernelCompileError naming the file, with the NVRTC log.
    """
    from cuda.core import Program, ProgramOptions

    path = Path(path)
    source = path.read_text()
    headers = {p.name: p.read_text() for p in sorted(path.parent.glob("*.cuh"))}
    options = (f"-std={CUDA_STD}", *(f"-D{d}" for d in defines))
    key = cache_key(source, headers, options, arch)
    cached = kernel_cache() / f"{path.stem}-{arch}-{key[:20]}.cubin"
    if cached.exists():
        return cached.read_bytes()
    opts = ProgramOptions(name=path.name, arch=arch, std=CUDA_STD,
                          include_path=[str(path.parent), cuda_include_dir()],
                          define_macro=list(defines) or None)
    try:
        code = Program(source, "c++", opts).compile("cubin").code
    except Exception as e:  # cuda.core's NVRTCError carries the compile log in its message
        raise KernelCompileError(f"{path}: NVRTC {nvrtc_version()} failed for {arch}:\n{e}") from None
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(code)
    tmp.replace(cached)  # atomic: a concurrent process never reads half a cubin
    return code


def ptxas_report(path: Path, arch: str) -> str:
    """The assembler's verbose report on one .cu file for `arch`, compiled afresh (not cached): per kernel its
    registers, spills and stack, and its performance notes (e.g. where it serialised wgmma instructions)."""
    import io

    from cuda.core import Program, ProgramOptions

    path = Path(path)
    opts = ProgramOptions(name=path.name, arch=arch, std=CUDA_STD, ptxas_options=["-v"],
                          include_path=[str(path.parent), cuda_include_dir()])
    log = io.StringIO()
    Program(path.read_text(), "c++", opts).compile("cubin", logs=log)
    return log.getvalue()


class KernelModule:
    """The kernels of one compiled .cu file, loaded on the current device."""

    def __init__(self, path: Path, arch: str, defines: tuple[str, ...] = ()):
        from cuda.core import ObjectCode

        self.path = Path(path)
        self._code = ObjectCode.from_cubin(compile_cubin(self.path, arch, defines), name=self.path.name)

    def kernel(self, name: str):
        try:
            return self._code.get_kernel(name)
        except Exception as e:
            raise KernelCompileError(f"{self.path}: no kernel named {name!r} ({e})") from None
