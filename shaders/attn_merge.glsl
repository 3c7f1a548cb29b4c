// Merging the split partials of flash-decoding attention (attention.comp writes, per split s and head h,
// acc[hd], max m_s, sum l_s): o = sum_s acc_s * e^(m_s - M) / sum_s l_s * e^(m_s - M).
// Used by attn_combine.comp (a dispatch of its own) and by attention.comp with FUSED_COMBINE (the last
// workgroup of a query's splits merges them). Reads go through the coherent arena alias `actc`.

layout(binding = 1) coherent buffer ArenaC { float actc[]; };

// first key the query at position p attends to (its sliding window's start, or 0)
uint first_key(uint p, uint window) { return (window > 0u && p + 1u > window) ? p + 1u - window : 0u; }

// keys per split for the query at position p: its keys spread over at most n_split splits, at least
// min_keys a split and a multiple of min_keys (so the grid stays n_split wide at every context depth, and a
// split's keys grow with the depth instead of the grid: docs/backend-vulkan.md#attention-splits)
uint split_len(uint p, uint window, uint min_keys, uint n_split) {
    uint keys = p + 1u - first_key(p, window);
    uint per = (keys + n_split - 1u) / n_split;
    return max(min_keys, (per + min_keys - 1u) / min_keys * min_keys);
}

// number of splits holding keys for the query at position p
uint splits_used(uint p, uint window, uint min_keys, uint n_split) {
    uint keys = p + 1u - first_key(p, window);
    uint len = split_len(p, window, min_keys, n_split);
    return min(n_split, (keys + len - 1u) / len);
}

// The split weights of one merge, e^(m_s - M) / L, for queries of at most MERGE_SPLITS used splits (more
// take the loop that recomputes them per dim); and the subgroups' partial max / sum of a workgroup reduction.
const uint MERGE_SPLITS = 64u;
shared float merge_w[MERGE_SPLITS];
shared float merge_red[256];  // one per subgroup: at most 1024 invocations of at least 4 lanes

// max (take_max) or sum of v over the workgroup's threads (every thread gets it)
float merge_reduce(float v, bool take_max) {
    v = take_max ? subgroupMax(v) : subgroupAdd(v);
    barrier();  // merge_red is free (an earlier reduction may still be reading it)
    if (subgroupElect()) merge_red[gl_SubgroupID] = v;
    barrier();
    float r = take_max ? -1.0e30 : 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) r = take_max ? max(r, merge_red[i]) : r + merge_red[i];
    return r;
}

// merge head h of token t into out[o_base + d]; threads tid, tid + nthreads, ... take the splits' maxima and
// sums, then the dims (the whole workgroup calls it: it holds barriers). The splits' (m, l) are read once,
// in parallel, and a dim's partials are weighted from shared memory, four splits' loads issued together: a
// loop over the splits per dim waited one memory round trip per split.
void merge_head(uint part_off, uint n_split, uint n_heads, uint hd, uint t, uint h, uint used, uint o_base,
                uint tid, uint nthreads) {
    uint stride = hd + 2u, sstep = n_heads * stride;
    uint base = part_off + (t * n_split * n_heads + h) * stride;
    float mx = -1.0e30;
    for (uint s = tid; s < used; s += nthreads) mx = max(mx, actc[base + s * sstep + hd]);
    float M = merge_reduce(mx, true);
    float l = 0.0;
    for (uint s = tid; s < used; s += nthreads) {
        uint b = base + s * sstep;
        float w = exp(actc[b + hd] - M);
        l += actc[b + hd + 1u] * w;
        if (s < MERGE_SPLITS) merge_w[s] = w;
    }
    float L = merge_reduce(l, false);  // its barriers also publish merge_w
    float inv = 1.0 / L;
    for (uint d = tid; d < hd; d += nthreads) {
        float o = 0.0;
        if (used <= MERGE_SPLITS) {
            uint s = 0u;
            for (; s + 4u <= used; s += 4u) {
                uint b = base + s * sstep + d;
                float a0 = actc[b], a1 = actc[b + sstep], a2 = actc[b + 2u * sstep], a3 = actc[b + 3u * sstep];
                o += a0 * merge_w[s] + a1 * merge_w[s + 1u] + a2 * merge_w[s + 2u] + a3 * merge_w[s + 3u];
            }
            for (; s < used; ++s) o += actc[base + s * sstep + d] * merge_w[s];
        } else {
            for (uint s = 0u; s < used; ++s) {
                uint b = base + s * sstep;
                o += actc[b + d] * exp(actc[b + hd] - M);
            }
        }
        actc[o_base + d] = o * inv;
    }
}

#ifdef QUANT_OUT
// The merged output at o (n_blk 32-value blocks of one token row, from block blk0 of its int8 row) as int8
// blocks of the token row whose codes start at uvec4 q8b (k values a row; q8_block.glsl, included first):
// the input of the integer matvec that reads it next. Threads tid, tid + nthreads, ... take the blocks; call
// after a barrier that follows the merge's stores.
void merged_to_q8(uint o, uint q8b, uint k, uint blk0, uint n_blk, uint tid, uint nthreads) {
    for (uint b = tid; b < n_blk; b += nthreads) {
        float v[32];
        [[unroll]] for (uint i = 0u; i < 32u; ++i) v[i] = actc[o + 32u * b + i];
        store_q8_block(v, q8b, q8b + k / 16u, blk0 + b);
    }
}
#endif
