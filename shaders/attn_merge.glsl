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

// merge head h of token t into out[o_base + d]; threads tid, tid + nthreads, ... take the dims
void merge_head(uint part_off, uint n_split, uint n_heads, uint hd, uint t, uint h, uint used, uint o_base,
                uint tid, uint nthreads) {
    uint stride = hd + 2u;
    uint base = part_off + (t * n_split * n_heads + h) * stride;
    float M = -1.0e30;
    for (uint s = 0u; s < used; ++s) M = max(M, actc[base + s * n_heads * stride + hd]);
    float L = 0.0;
    for (uint s = 0u; s < used; ++s) {
        uint b = base + s * n_heads * stride;
        L += actc[b + hd + 1u] * exp(actc[b + hd] - M);
    }
    for (uint d = tid; d < hd; d += nthreads) {
        float o = 0.0;
        for (uint s = 0u; s < used; ++s) {
            uint b = base + s * n_heads * stride;
            o += actc[b + d] * exp(actc[b + hd] - M);
        }
        actc[o_base + d] = o / L;
    }
}
