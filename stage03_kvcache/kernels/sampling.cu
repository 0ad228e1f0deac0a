// sampling.cu: the next token from one row of logits, on the GPU; only the chosen id (4 bytes) leaves it.
//
//   greedy (temperature == 0):  token = argmax_i l_i, the first index on ties
//   otherwise:                  q_i = exp((l_i - max l) / T)                      (softmax(l / T), unnormalised)
//     kept set S: the most likely tokens, at most top_k of them (0 = no limit), then of those the smallest prefix
//                 holding top_p of their probability (vLLM's order);  token ~ q_i / sum_{j in S} q_j over S
//   logits (V,) fp32; out (1,) int32.
//
// Finding S without sorting V = 128256 values: S is every token whose logit is >= a cutoff c. Both count(l >= c)
// and mass(l >= c) shrink as c grows, so top_k's cutoff is the largest c with count(l >= c) >= top_k, and top_p's
// then the largest c above it with mass(l >= c) >= top_p * M, M the mass top_k kept (sum_i q_i without top_k).
// Floats map to uint32 keys in the same order, so each cutoff is found by bisection over the 2^32 keys: 32
// passes over the row (64 with both), each a count and a mass summed by the block. (All tokens tied with c at
// the cutoff are kept.)
//
// The draw: u = hash(seed, counter) in [0, 1), counter = the request's number of tokens generated so far. This
// is a counter-based generator: the n-th draw of a request depends only on (seed, n), no state is carried, and
// the same seed gives the same tokens. Then token = the first i (in index order) where the running kept mass
// exceeds u * mass(S): each thread owns a contiguous chunk of the row, a block scan gives every chunk its
// starting mass, and the one chunk that holds the target walks its elements.
//
// Launch: grid 1, block 1024 (THREADS). The row is read from L2 once per pass. Greedy is one pass.
#include "block_reduce.cuh"

#define THREADS 1024

__device__ unsigned int order_key(float f) {   // a < b  <=>  order_key(a) < order_key(b) (non-NaN floats)
    const unsigned int u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ float uniform01(unsigned long long seed, unsigned long long counter) {   // splitmix64 finaliser
    unsigned long long z = seed + (counter + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);                      // 24 bits: [0, 1)
}

extern "C" __global__ void sample_token(const float* __restrict__ logits, int vocab, float temperature,
                                        int top_k, float top_p, unsigned long long seed,
                                        unsigned long long counter, int* __restrict__ out) {
    __shared__ float scratch[32];
    __shared__ int iscratch[32];
    __shared__ float chunk_start[THREADS];
    __shared__ int chosen;
    const int tid = threadIdx.x;

    float lmax = NEG_INF;
    for (int i = tid; i < vocab; i += THREADS) lmax = fmaxf(lmax, logits[i]);
    lmax = block_reduce(lmax, MaxOp(), scratch);
    if (temperature == 0.0f) {                           // greedy: the smallest index holding the max
        int first = 0x7fffffff;
        for (int i = tid; i < vocab; i += THREADS) {
            if (logits[i] == lmax) { first = i; break; }
        }
        first = block_reduce(first, MinIntOp(), iscratch);
        if (tid == 0) *out = first;
        return;
    }
    const float inv_t = 1.0f / temperature;
    const int k = (top_k <= 0 || top_k > vocab) ? vocab : top_k;

    // mass and count of {i : key(l_i) >= cut}, summed by the block
    auto kept = [&](unsigned int cut, float& mass) {
        float m = 0.0f;
        int c = 0;
        for (int i = tid; i < vocab; i += THREADS) {
            const float l = logits[i];
            if (order_key(l) >= cut) { m += __expf((l - lmax) * inv_t); ++c; }
        }
        mass = block_reduce(m, SumOp(), scratch);
        return static_cast<int>(block_reduce(static_cast<float>(c), SumOp(), scratch));
    };
    float total;
    kept(0u, total);
    unsigned int cut = 0u;                               // invariant: bisect's test below holds at `cut`
    float kept_mass = total;
    // raise cut to the largest key that still keeps at least min_count logits and min_mass of mass
    // (a plain lambda: NVRTC 13.0 takes a generic one's operator() for host code)
    auto bisect = [&](int min_count, float min_mass) {
        unsigned int hi = 0xffffffffu;
        while (cut < hi) {
            const unsigned int mid = cut + static_cast<unsigned int>((1ull + hi - cut) / 2);  // no wrap at 2^32
            float mass;
            const int count = kept(mid, mass);
            if (count >= min_count && mass >= min_mass) { cut = mid; kept_mass = mass; } else { hi = mid - 1u; }
        }
    };
    if (k < vocab) bisect(k, 0.0f);
    if (top_p < 1.0f) bisect(0, top_p * kept_mass);      // top_p of what top_k kept, from its cutoff up

    // draw: first index whose running kept mass exceeds target (index order, one contiguous chunk per thread)
    const float target = uniform01(seed, counter) * kept_mass;
    const int chunk = (vocab + THREADS - 1) / THREADS, lo = tid * chunk, hi_i = min(lo + chunk, vocab);
    float mine = 0.0f;
    int last_kept = -1;
    for (int i = lo; i < hi_i; ++i) {
        const float l = logits[i];
        if (order_key(l) >= cut) { mine += __expf((l - lmax) * inv_t); last_kept = i; }
    }
    chunk_start[tid] = mine;
    if (tid == 0) chosen = 0x7fffffff;
    __syncthreads();
    for (int offset = 1; offset < THREADS; offset <<= 1) {   // inclusive scan (Hillis-Steele), then shift
        const float add = tid >= offset ? chunk_start[tid - offset] : 0.0f;
        __syncthreads();
        chunk_start[tid] += add;
        __syncthreads();
    }
    const float start = chunk_start[tid] - mine;
    if (mine > 0.0f && target >= start && target < chunk_start[tid]) {
        float run = start;
        int pick = last_kept;
        for (int i = lo; i < hi_i; ++i) {
            const float l = logits[i];
            if (order_key(l) >= cut) {
                run += __expf((l - lmax) * inv_t);
                if (run > target) { pick = i; break; }
            }
        }
        atomicMin(&chosen, pick);
    }
    const int fallback = block_reduce(last_kept, MaxIntOp(), iscratch);   // rounding left target past the end
    if (tid == 0) *out = chosen != 0x7fffffff ? chosen : fallback;
}
