// Merging the split partials of flash-decoding attention (attention.comp writes, per split s and head h,
// acc[hd], max m_s, sum l_s): o = sum_s acc_s * e^(m_s - M) / sum_s l_s * e^(m_s - M).
// Used by attn_combine.comp (a dispatch of its own) and by attention.comp with FUSED_COMBINE (the last
// workgroup of a query's splits merges them). Reads go through the coherent arena alias `actc`.

layout(binding = 1) coherent buffer ArenaC { float actc[]; };

// number of splits holding keys for the query at position p
uint splits_used(uint p, uint window, uint split_keys, uint n_split) {
    uint lo = (window > 0u && p + 1u > window) ? p + 1u - window : 0u;
    return min(n_split, (p + 1u - lo + split_keys - 1u) / split_keys);
}

const uint MERGE_CHUNK = 64u;   // splits whose weights are staged in shared memory at once
const uint MERGE_DIMS = 8u;     // head dims a thread holds (head_dim <= 8 * threads)
shared float merge_w[MERGE_CHUNK];
shared float merge_red[128];

// Max (take_max) or sum of one value per thread over the workgroup; every thread gets it.
float merge_reduce(float v, bool take_max) {
    v = take_max ? subgroupMax(v) : subgroupAdd(v);
    barrier();  // merge_red is free
    if (subgroupElect()) merge_red[gl_SubgroupID] = v;
    barrier();
    float r = merge_red[0];
    for (uint i = 1u; i < gl_NumSubgroups; ++i) r = take_max ? max(r, merge_red[i]) : r + merge_red[i];
    return r;
}

// merge head h of token t into out[o_base + d]; the workgroup's threads (tid of nthreads, in uniform control
// flow) take the splits for M and L (one pass each, not a loop per thread: a split's loads are independent),
// then the dims, with the splits' weights e^(m_s - M) staged in shared memory
void merge_head(uint part_off, uint n_split, uint n_heads, uint hd, uint t, uint h, uint used, uint o_base,
                uint tid, uint nthreads) {
    uint stride = hd + 2u, step = n_heads * stride;
    uint base = part_off + (t * n_split * n_heads + h) * stride;
    float m = -1.0e30;
    for (uint s = tid; s < used; s += nthreads) m = max(m, actc[base + s * step + hd]);
    float M = merge_reduce(m, true);
    float l = 0.0;
    for (uint s = tid; s < used; s += nthreads) {
        uint b = base + s * step;
        l += actc[b + hd + 1u] * exp(actc[b + hd] - M);
    }
    float L = merge_reduce(l, false);
    for (uint d0 = 0u; d0 < hd; d0 += MERGE_DIMS * nthreads) {  // one pass unless hd > 8 * nthreads
        float o[MERGE_DIMS];
        [[unroll]] for (uint k = 0u; k < MERGE_DIMS; ++k) o[k] = 0.0;
        for (uint c0 = 0u; c0 < used; c0 += MERGE_CHUNK) {
            uint n = min(MERGE_CHUNK, used - c0);
            barrier();  // the previous chunk's weights are read
            for (uint s = tid; s < n; s += nthreads) merge_w[s] = exp(actc[base + (c0 + s) * step + hd] - M);
            barrier();
            for (uint s = 0u; s < n; ++s) {
                float w = merge_w[s];
                uint b = base + (c0 + s) * step;
                [[unroll]] for (uint k = 0u; k < MERGE_DIMS; ++k) {
                    uint d = d0 + tid + k * nthreads;
                    if (d < hd) o[k] += actc[b + d] * w;
                }
            }
        }
        [[unroll]] for (uint k = 0u; k < MERGE_DIMS; ++k) {
            uint d = d0 + tid + k * nthreads;
            if (d < hd) actc[o_base + d] = o[k] / L;
        }
    }
}
