// pdl.cuh: programmatic dependent launch (sm_90): a decode step's next kernel starts before this one ends.
//
// In a stream, a kernel normally starts only once the one before has finished: at batch 1 each of a step's ~165
// kernels then pays its launch and ramp-up (blocks scheduled, first loads in flight) with the GPU otherwise
// idle. Launched with programmatic stream serialization (kernels.py), a kernel may start as soon as every
// block of the kernel before it has called launch_dependents() (or exited); it then calls wait_for_inputs(),
// which holds the thread until that kernel has finished and its writes are visible. Between the two, a kernel
// may read only what no kernel of a step writes: the weights (gemv.cu loads its first weights there); the step's
// inputs, copied in before its first kernel; and the block tables, with the cached keys and values of positions
// the step does not write (attention_tiles.cu's decode rows): the launch after block_table_write(), the one kernel
// that writes tables, is not early (kernels.py), so every kernel after it starts once the tables are whole.
//
// Rules that keep it correct: every kernel calls wait_for_inputs() in every thread before its first read of an
// activation and its first write, even a thread with nothing to do -- so a kernel's end implies the end of all
// kernels before it, and the chain stays ordered however far the launches run ahead. A kernel launched
// without the attribute (after a cuBLAS GEMM or a copy) passes wait_for_inputs() at once.
#pragma once

__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ void wait_for_inputs() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// the common case: let the next kernel launch, then wait for this one's inputs
__device__ __forceinline__ void begin_after_previous() {
    launch_dependents();
    wait_for_inputs();
}
