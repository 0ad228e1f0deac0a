// spin.cu: keep the GPU busy for a given time, doing nothing (a benchmarking tool, not part of any model).
//
//   one thread reads the GPU's nanosecond clock (%globaltimer) until `ns` have passed.
//
// Why: to time a decode step's GPU work without the host's launch overhead in it, launch this first, then
// queue the step's kernels while the GPU spins: when it reaches them they are all queued, so the time between
// two events around them is GPU work alone, and the host's time to queue them is measured separately.
// Launch: grid 1, block 1.

extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
