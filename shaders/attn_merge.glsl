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
