// chain.cu: a kernel that does nothing but follow the one before it (a benchmarking tool, not part of any model):
// what one launch costs on its own, in a graph, with programmatic dependent launch (sm_90) and without.
//
//   every thread: griddepcontrol.launch_dependents; griddepcontrol.wait; x[i] += 1 for its element i
//
// Launched n times in a row over the same x, every x[i] gains exactly n only if each launch read what the one
// before wrote: the order griddepcontrol.wait must keep when the next launch starts early. Without programmatic
// stream serialization both instructions do nothing, and each launch starts once the one before has ended.
// Launch: grid blocks, block threads; x (blocks * threads) i32.

extern "C" __global__ void chain(int* x) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] += 1;
}
