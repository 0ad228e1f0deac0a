// overlap.cu: whether a kernel launched with programmatic dependent launch starts while the kernel before it still
// runs on the same SM, when each block takes a given amount of shared memory (a benchmarking tool, not part of any
// model).
//
//   every block: stamp its start (%globaltimer) and its SM (%smid), hold the SM for hold_ns, griddepcontrol.wait,
//   then stamp its end
//
// Launched twice back to back with programmatic stream serialization, the first holding its SMs and the second not:
// a block of the second that starts before the first's block on its SM has ended ran beside it, on an SM with room
// for both (threads, registers, and the shared memory the launch's size and its carveout leave). The wait keeps
// the second's end after the first's: each end stamp of the second comes after every end stamp of the first.
// Launch: grid blocks, block threads, any dynamic shared memory; stamps (blocks, 3) u64, a launch's own.

// The launch's dynamic shared memory is what the scheduler must fit on an SM, touched or not: the kernel leaves it.
extern "C" __global__ void overlap(unsigned long long* stamps, unsigned long long hold_ns) {
    unsigned long long start, now;
    unsigned int sm;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < hold_ns);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (threadIdx.x == 0) {
        stamps[3 * blockIdx.x] = start;
        stamps[3 * blockIdx.x + 1] = now;
        stamps[3 * blockIdx.x + 2] = sm;
    }
}
