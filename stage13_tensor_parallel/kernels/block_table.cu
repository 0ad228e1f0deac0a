// block_table.cu: a step's new block-table entries, written into the device's block tables before its first layer.
//
//   block_tables[updates[i][0]] = updates[i][1]      for i < n
//   block_tables (B, table_width) i32, seen flat: entry b * table_width + j is the block of seq_slot b's
//   positions j BS .. (j + 1) BS - 1; updates (n, 2) i32: (flat index, block), built by packing.py from the
//   blocks each sequence got since its entries were last written (a few a step; all of a (re)admitted one's).
//
// The tables persist on the GPU from step to step (vLLM keeps them so too): a step sends what changed, not
// every running sequence's whole table. Launch: grid ceil(n / 256), block 256.

#include "pdl.cuh"

extern "C" __global__ void block_table_write(int* __restrict__ block_tables, const int* __restrict__ updates,
                                             int n) {
    begin_after_previous();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) block_tables[updates[2 * i]] = updates[2 * i + 1];
}
