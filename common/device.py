"""CUDA plumbing on cuda.core: one device, one stream, typed device arrays, pinned staging, events.

Everything the stages run goes on `Gpu.stream`, so ordering is the stream's and a host read needs one `sync()`.
bf16 arrays travel as uint16 bit patterns on the host (see common/bf16.py).
"""
from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import numpy as np

# dtype name -> (bytes per element, numpy dtype that holds it on the host)
DTYPES = {
    "bf16": (2, np.uint16),
    "f32": (4, np.float32),
    "i32": (4, np.int32),
    "u8": (1, np.uint8),
    "u16": (2, np.uint16),
    "u32": (4, np.uint32),
    "u64": (8, np.uint64),
}


class NoGpuError(RuntimeError):
    """Raised where GPU work is asked for and no usable CUDA device exists; the message says why."""


class GpuMemoryError(MemoryError):
    """A device allocation did not fit; the message names its size, its shape and what the device had free."""


def _driver():
    from cuda.bindings import driver

    return driver


def check(result, what: str):
    """Unpack a cuda.bindings call's (err, *values) and raise with the call's name on failure."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise RuntimeError(f"{what} failed: {err.name}: {msg.decode() if msg else ''}")
    return values[0] if len(values) == 1 else (values or None)


@functools.cache
def probe_gpu() -> tuple[bool, str, str]:
    """(usable, one line in the project's words, the library's own message for --verbose)."""
    try:
        driver = _driver()
        err, = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False, "the NVIDIA driver did not start", f"cuInit returned {err.name}"
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or count == 0:
            return False, "the NVIDIA driver sees no CUDA device", f"cuDeviceGetCount: {err.name}, {count} devices"
        err, name = driver.cuDeviceGetName(256, 0)
        name = name.split(b"\0")[0].decode()
        return True, name, name
    except ImportError as e:
        return False, "cuda-python is not installed", str(e)
    except Exception as e:  # cuda.pathfinder raises when libcuda.so is absent (a machine without a driver)
        return False, "no NVIDIA driver on this machine", f"{type(e).__name__}: {e}"


def gpu_count() -> int:
    """CUDA devices the driver sees (0 where there is no driver or none)."""
    if not probe_gpu()[0]:
        return 0
    driver = _driver()
    return check(driver.cuDeviceGetCount(), "cuDeviceGetCount")


def has_gpu() -> tuple[bool, str]:
    """(True, device name) when a CUDA device is usable, else (False, the reason in one line)."""
    return probe_gpu()[:2]


def elements(shape: tuple[int, ...]) -> int:
    """The element count of a shape, as a Python int (no overflow, whatever integer type the dims are). Not
    np.prod, whose few microseconds a call add up over the hundreds of views an eager prefill makes: host time
    before the first token."""
    return math.prod(map(int, shape))


@dataclass
class DeviceArray:
    """A typed view of device memory: a pointer, a shape and a dtype name, plus the allocation it lives in."""

    ptr: int
    shape: tuple[int, ...]
    dtype: str
    owner: object = None  # keeps the cuda.core Buffer (or arena) alive while any view exists

    @functools.cached_property
    def size(self) -> int:                           # a view's shape is fixed once made
        return elements(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * DTYPES[self.dtype][0]

    @property
    def arg(self) -> np.uint64:
        """The pointer as a kernel argument (cuda.core packs numpy scalars by their C type)."""
        return np.uint64(self.ptr)

    def view(self, byte_offset: int, shape: tuple[int, ...], dtype: str | None = None) -> "DeviceArray":
        dtype = dtype or self.dtype
        nbytes = elements(shape) * DTYPES[dtype][0]
        if byte_offset < 0 or byte_offset + nbytes > self.nbytes:
            raise ValueError(f"view [{byte_offset}, {byte_offset + nbytes}) outside an array of {self.nbytes} bytes")
        return DeviceArray(self.ptr + byte_offset, tuple(shape), dtype, self.owner)


class PinnedBuffer:
    """Page-locked host memory: the DMA engine reads it directly, so host->device copies run at PCIe speed
    and can be asynchronous. `array` is a uint8 numpy view of it."""

    def __init__(self, nbytes: int):
        from cuda.core import LegacyPinnedMemoryResource

        self.buffer = LegacyPinnedMemoryResource().allocate(nbytes)
        self.ptr = int(self.buffer.handle)
        self.nbytes = nbytes
        self.array = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(self.ptr), dtype=np.uint8)


class Gpu:
    """The device, its one stream, and the memory operations the stages need."""

    def __init__(self, device_id: int = 0):
        ok, why = has_gpu()
        if not ok:
            raise NoGpuError(f"no GPU: {why}")
        from cuda.core import Device

        self.device = Device(device_id)
        self.device.set_current()
        self.stream = self.device.create_stream()
        self.name = self.device.name
        major, minor = self.device.compute_capability
        self.arch = f"sm_{major}{minor}"
        self._staging: PinnedBuffer | None = None

    # ---------------------------------------------------------------- memory
    def empty(self, shape: tuple[int, ...], dtype: str) -> DeviceArray:
        nbytes = max(1, elements(shape) * DTYPES[dtype][0])
        try:
            buf = self.device.allocate(nbytes, stream=self.stream)
        except Exception as e:
            if "OUT_OF_MEMORY" not in str(e) and "out of memory" not in str(e).lower():
                raise
            free, total = self.memory()
            raise GpuMemoryError(f"cannot allocate {nbytes / 1e9:.2f} GB for a {shape} {dtype} array: the device "
                                 f"has {free / 1e9:.2f} GB free of {total / 1e9:.1f} GB") from None
        return DeviceArray(int(buf.handle), tuple(shape), dtype, buf)

    def fill_bytes(self, arr: DeviceArray, byte: int) -> None:
        """Set every byte (used to poison outputs before a kernel test: 0xFF makes bf16/f32 NaNs)."""
        driver = _driver()
        check(driver.cuMemsetD8Async(arr.ptr, byte, arr.nbytes, self.stream.handle), "cuMemsetD8Async")

    def staging(self, nbytes: int) -> PinnedBuffer:
        """A reusable pinned buffer of at least nbytes (grown, never shrunk)."""
        if self._staging is None or self._staging.nbytes < nbytes:
            if self._staging is not None:
                self.sync()  # an in-flight copy may still read the old one
            self._staging = PinnedBuffer(nbytes)
        return self._staging

    def copy_to_device_async(self, dst_ptr: int, src_host_ptr: int, nbytes: int) -> None:
        check(_driver().cuMemcpyHtoDAsync(dst_ptr, src_host_ptr, nbytes, self.stream.handle), "cuMemcpyHtoDAsync")

    def copy_to_host_async(self, dst_host_ptr: int, src_ptr: int, nbytes: int) -> None:
        check(_driver().cuMemcpyDtoHAsync(dst_host_ptr, src_ptr, nbytes, self.stream.handle), "cuMemcpyDtoHAsync")

    def to_device(self, host: np.ndarray, dtype: str | None = None) -> DeviceArray:
        """Copy a numpy array to a new device array through the pinned staging buffer.
        bf16 data is passed as uint16 bit patterns with dtype="bf16"."""
        host = np.ascontiguousarray(host)
        dtype = dtype or _dtype_name(host.dtype)
        if DTYPES[dtype][1] != host.dtype.type:
            raise TypeError(f"host array of {host.dtype} cannot be uploaded as {dtype}")
        out = self.empty(host.shape, dtype)
        stage = self.staging(host.nbytes)
        self.sync()  # the staging buffer may still feed an earlier copy
        stage.array[: host.nbytes] = host.reshape(-1).view(np.uint8)
        self.copy_to_device_async(out.ptr, stage.ptr, host.nbytes)
        self.sync()
        return out

    def to_host(self, arr: DeviceArray) -> np.ndarray:
        """Copy a device array back into a fresh numpy array (waits for all queued work)."""
        stage = self.staging(arr.nbytes)
        self.copy_to_host_async(stage.ptr, arr.ptr, arr.nbytes)
        self.sync()
        return stage.array[: arr.nbytes].view(DTYPES[arr.dtype][1]).reshape(arr.shape).copy()

    def memory(self) -> tuple[int, int]:
        """(free bytes, total bytes) on the device, once the memory pool has given back what no array holds.
        cuda.core's pool keeps freed memory reserved for this process (it raises the pool's release threshold
        to the maximum), so without the trim an engine dropped in this process would read as memory in use, and
        another allocator (torch's) could not have it. The stages allocate only while an engine is built, so
        giving freed memory back costs them nothing."""
        driver = _driver()
        self.sync()                                # frees are stream-ordered: let the queued ones happen
        pool = driver.CUmemoryPool(int(self.device.memory_resource.handle))
        check(driver.cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo")
        free, total = check(driver.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def allow_shared_memory(self, kernel, nbytes: int, carveout: int | None = None) -> None:
        """Let `kernel` launch with up to nbytes of dynamic shared memory: past 48 KiB a kernel must ask for it
        (the function attribute MAX_DYNAMIC_SHARED_SIZE_BYTES). carveout: also ask for this percent of the SM's
        L1 and shared memory to be shared memory (PREFERRED_SHARED_MEMORY_CARVEOUT; -1, the driver's choice), a
        hint the driver weighs when it fits blocks on an SM."""
        driver = _driver()
        attributes = driver.CUfunction_attribute
        handle = getattr(kernel, "handle", None) or kernel._handle
        wanted = [(attributes.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)]
        if carveout is not None:
            wanted.append((attributes.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, carveout))
        for attribute, value in wanted:
            check(driver.cuKernelSetAttribute(attribute, value, handle, self.device.device_id), "cuKernelSetAttribute")

    def copy_columns(self, dst: DeviceArray, first_col: int, src: DeviceArray) -> None:
        """dst[:, first_col:first_col + c] = src on the stream, for row-major dst (n, C) and src (n, c) of one
        dtype: one strided copy (cuMemcpy2DAsync), which a graph captures like a kernel."""
        driver = _driver()
        (n, C), (rows, c), size = dst.shape, src.shape, DTYPES[src.dtype][0]
        if dst.dtype != src.dtype or rows != n or not 0 <= first_col <= C - c:
            raise ValueError(f"copy_columns: {src.shape} {src.dtype} does not fit {dst.shape} {dst.dtype} at column "
                             f"{first_col}")
        copy = driver.CUDA_MEMCPY2D()
        copy.srcMemoryType = copy.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
        copy.srcDevice, copy.srcPitch = src.ptr, c * size
        copy.dstDevice, copy.dstPitch, copy.dstXInBytes = dst.ptr, C * size, first_col * size
        copy.WidthInBytes, copy.Height = c * size, n
        check(driver.cuMemcpy2DAsync(copy, self.stream.handle), "cuMemcpy2DAsync")

    # ---------------------------------------------------------------- work and time
    def launch(self, kernel, config, *args) -> None:
        from cuda.core import launch

        launch(self.stream, config, kernel, *args)

    def sync(self) -> None:
        self.stream.sync()

    def copy_bandwidth_gbps(self, nbytes: int = 1 << 30, repeats: int = 10) -> float:
        """Device-to-device copy rate, counting bytes read plus bytes written (the ceiling a memory-bound kernel
        is measured against). Median of `repeats` event-timed copies after one warm-up."""
        src, dst = self.empty((nbytes,), "u8"), self.empty((nbytes,), "u8")
        self.fill_bytes(src, 0x3C)  # not zeros: a copy of zeros can run faster than real data
        times = []
        for i in range(repeats + 1):
            start = self.record()
            check(_driver().cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, self.stream.handle), "cuMemcpyDtoDAsync")
            end = self.record()
            end.sync()
            if i:
                times.append(end - start)
        return 2 * nbytes / (sorted(times)[len(times) // 2] / 1e3) / 1e9

    def capture(self, work) -> "CudaGraph":
        """Run work() with the stream in capture mode: its kernels, copies and cuBLAS calls are recorded into a
        graph, not run, and come back as a CudaGraph to replay. What work() queues must not depend on anything
        but device memory at fixed addresses, and it may not wait for the GPU (in this thread, the driver
        refuses such calls while capturing, and the capture fails with their name)."""
        driver = _driver()
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(driver.cuStreamBeginCapture(self.stream.handle, mode), "cuStreamBeginCapture")
        try:
            work()
        except BaseException:
            driver.cuStreamEndCapture(self.stream.handle)    # leave capture mode; the partial graph is dropped
            raise
        return CudaGraph(self, check(driver.cuStreamEndCapture(self.stream.handle), "cuStreamEndCapture"))

    def record(self):
        """Record a timing event on the stream; `end - start` of two events is milliseconds of GPU time."""
        from cuda.core import EventOptions

        return self.stream.record(options=EventOptions(timing_enabled=True))


class CudaGraph:
    """Stream work captured once (Gpu.capture) and replayed with one launch: the same kernels, with the same
    arguments, in the same order, reading whatever the device memory they name holds at replay."""

    def __init__(self, gpu: Gpu, graph):
        driver = _driver()
        self.gpu, self._graph = gpu, graph
        self.num_nodes = check(driver.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1]   # launches it replaces
        self._exec = check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        check(driver.cuGraphUpload(self._exec, gpu.stream.handle), "cuGraphUpload")    # its setup, done now

    def launch(self) -> None:
        """Queue one replay on the stream."""
        check(_driver().cuGraphLaunch(self._exec, self.gpu.stream.handle), "cuGraphLaunch")

    def __del__(self):
        driver = _driver()
        if getattr(self, "_exec", None) is not None:
            driver.cuGraphExecDestroy(self._exec)
        driver.cuGraphDestroy(self._graph)


def _dtype_name(dtype: np.dtype) -> str:
    for name, (_, host) in DTYPES.items():
        if host == dtype.type and name != "bf16":
            return name
    raise TypeError(f"no device dtype for numpy {dtype}")


@functools.cache
def get_gpu() -> Gpu:
    """The process's one Gpu (device 0). Raises NoGpuError, with the reason, where there is none."""
    return Gpu(0)
