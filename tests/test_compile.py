"""Every kernel (each stage's, and common's spin) compiles for sm_90 with NVRTC, on any machine (no GPU needed)."""
import re
import struct
from pathlib import Path

import pytest

from common import compile as nvrtc

ROOT = Path(__file__).resolve().parents[1]
KERNELS = sorted([*ROOT.glob("stage*/kernels/*.cu"), *ROOT.glob("common/kernels/*.cu")])


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TINY_VLLM_CACHE", str(tmp_path))
    monkeypatch.delenv("TINY_VLLM_KERNEL_CACHE", raising=False)


@pytest.fixture(scope="module")
def kernels_compiled_here(tmp_path_factory):
    """One kernel cache for every case below, empty at the start of the run."""
    return tmp_path_factory.mktemp("kernels")


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_kernel_compiles_to_sm90_cubin(path, kernels_compiled_here, monkeypatch):
    """For sm_90, or sm_90a where the file's first line asks for it (nvrtc.arch_for). The cases share one cache,
    filled in this run: a stage's copy of an earlier stage's kernel, byte for byte, with the same headers beside
    it, has that file's cache key (source, headers, options, arch, NVRTC), so it is compiled once, by the
    earliest stage that has it, and its copies check that cubin."""
    monkeypatch.setenv("TINY_VLLM_KERNEL_CACHE", str(kernels_compiled_here))
    cubin = nvrtc.compile_cubin(path, nvrtc.arch_for(path, "sm_90"))
    assert cubin[:4] == b"\x7fELF"  # machine code, not PTX text
    # ELF64 header: e_machine 190 is EM_CUDA; e_flags holds the SM version in bits 8..15 (0x5a for sm_90)
    machine, flags = struct.unpack_from("<H", cubin, 18)[0], struct.unpack_from("<I", cubin, 48)[0]
    assert (machine, flags >> 8 & 0xFF) == (190, 90), (machine, hex(flags))


def test_cache_hits_and_keys(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n')
    first = nvrtc.compile_cubin(src, "sm_90")
    cached = list((tmp_path / "kernels").glob("k-sm_90-*.cubin"))
    assert len(cached) == 1 and cached[0].read_bytes() == first
    assert nvrtc.compile_cubin(src, "sm_90") == first                 # served from the cache
    nvrtc.compile_cubin(src, "sm_90", defines=("N=4",))              # options change the key
    nvrtc.compile_cubin(src, "sm_80")                                # so does the arch
    assert len(list((tmp_path / "kernels").glob("k-*.cubin"))) == 3


def test_the_kernel_cache_can_live_apart_from_the_cache_root(tmp_path, monkeypatch):
    """$TINY_VLLM_KERNEL_CACHE: the cubins alone, in a folder that can be copied to the next machine."""
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* x) { x[threadIdx.x] = 2.0f; }\n')
    monkeypatch.setenv("TINY_VLLM_KERNEL_CACHE", str(tmp_path / "carried"))
    first = nvrtc.compile_cubin(src, "sm_90")
    assert [p.read_bytes() for p in (tmp_path / "carried").glob("k-sm_90-*.cubin")] == [first]
    assert not (tmp_path / "kernels").exists()


def test_a_kernel_file_naming_sm_90a_on_its_first_line_is_built_for_it(tmp_path):
    hopper, plain = tmp_path / "h.cu", tmp_path / "p.cu"
    hopper.write_text("// h.cu: wgmma (sm_90a)\n")
    plain.write_text("// p.cu: nothing arch-specific\n// (unlike sm_90a kernels)\n")
    assert nvrtc.arch_for(hopper, "sm_90") == "sm_90a" and nvrtc.arch_for(plain, "sm_90") == "sm_90"
    assert nvrtc.arch_for(hopper, "sm_80") == "sm_80"          # no sm_90a code for another GPU


def test_compile_error_names_the_file_and_shows_the_log(tmp_path):
    bad = tmp_path / "broken.cu"
    bad.write_text('extern "C" __global__ void k() { int x = ; }\n')
    with pytest.raises(nvrtc.KernelCompileError, match=r"broken\.cu(.|\n)*expected an expression"):
        nvrtc.compile_cubin(bad, "sm_90")
    assert not list(tmp_path.glob("kernels/broken-*"))  # nothing cached for a failed compile


def test_every_kernel_file_the_code_loads_is_compiled_here():
    """The parametrised test above covers what the engines load: every "name.cu" a package's code names (its
    kernels.py, common's bench/measure.py) is a file of that package's kernels/ in KERNELS, and every stage with
    a kernels.py has some. A kernel file the glob missed (in a folder of its own, say) would go untested."""
    compiled = {(p.parent.parent.name, p.name) for p in KERNELS}
    named = {(py.relative_to(ROOT).parts[0], name) for py in [*ROOT.glob("stage*/*.py"), *ROOT.glob("common/**/*.py")]
             for name in re.findall(r"[\"']([A-Za-z0-9_]+\.cu)[\"']", py.read_text())}
    stages = {py.parent.name for py in ROOT.glob("stage*/kernels.py")}
    assert stages and stages <= {package for package, _ in named}, "a stage whose kernels.py loads no .cu file"
    assert ("common", "spin.cu") in named and named <= compiled, sorted(named - compiled)
