// Decoders of the weight formats, in the planar layout the Vulkan backend uploads
// (workbench/backends/vulkan/weights.py): each GGUF block field is gathered into its own plane, so the
// quantized values of a row are contiguous and 32-bit aligned. `pl` holds the planes' word offsets.
//
// Include with WBUF set to the weight buffer (w32 or w32b) and DEQ8 to the function name; the format is
// chosen by one of FMT_F32, FMT_F16, FMT_BF16, FMT_Q8_0, FMT_Q5_0, FMT_Q4_K, FMT_Q6_K (GGUF blocks) or the
// re-quantized planar formats of workbench/quant/planar.py: FMT_I8 (int8 per output channel: planes q, f32
// scale per row) and FMT_I4 with I4_GROUP=32/64/128 (planes q nibbles in split-halves order per group, f16
// scale per group, and with I4_ASYM a uint8 zero point per group).
// DEQ8(pl, K, row, c, lo, hi) decodes the 8 values at columns 8c..8c+7 of `row` (K columns).

#ifndef QUANT_HELPERS
#define QUANT_HELPERS
uint byte_of(uvec2 w, uint i) { return (w[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }
float half_at(uint word, uint which) { return unpackHalf2x16(word)[which]; }
// 8 signed bytes (two words) times a scale
void i8x8(uint w0, uint w1, float d, out vec4 lo, out vec4 hi) {
    int a = int(w0), b = int(w1);
    lo = d * vec4(bitfieldExtract(a, 0, 8), bitfieldExtract(a, 8, 8), bitfieldExtract(a, 16, 8), bitfieldExtract(a, 24, 8));
    hi = d * vec4(bitfieldExtract(b, 0, 8), bitfieldExtract(b, 8, 8), bitfieldExtract(b, 16, 8), bitfieldExtract(b, 24, 8));
}
#endif

void DEQ8(uvec4 pl, uint K, uint row, uint c, out vec4 lo, out vec4 hi) {
    uint e = row * K + 8u * c;
#if defined(FMT_F32)
    uint b = pl.x + e;
    lo = vec4(uintBitsToFloat(WBUF[b]), uintBitsToFloat(WBUF[b + 1]), uintBitsToFloat(WBUF[b + 2]), uintBitsToFloat(WBUF[b + 3]));
    hi = vec4(uintBitsToFloat(WBUF[b + 4]), uintBitsToFloat(WBUF[b + 5]), uintBitsToFloat(WBUF[b + 6]), uintBitsToFloat(WBUF[b + 7]));
#elif defined(FMT_F16)
    uint b = pl.x + e / 2u;
    lo = vec4(unpackHalf2x16(WBUF[b]), unpackHalf2x16(WBUF[b + 1]));
    hi = vec4(unpackHalf2x16(WBUF[b + 2]), unpackHalf2x16(WBUF[b + 3]));
#elif defined(FMT_BF16)
    uint b = pl.x + e / 2u;
    uvec4 w = uvec4(WBUF[b], WBUF[b + 1], WBUF[b + 2], WBUF[b + 3]);
    lo = vec4(uintBitsToFloat(w.x << 16), uintBitsToFloat(w.x & 0xFFFF0000u), uintBitsToFloat(w.y << 16), uintBitsToFloat(w.y & 0xFFFF0000u));
    hi = vec4(uintBitsToFloat(w.z << 16), uintBitsToFloat(w.z & 0xFFFF0000u), uintBitsToFloat(w.w << 16), uintBitsToFloat(w.w & 0xFFFF0000u));
#elif defined(FMT_Q8_0)
    uint b = pl.x + e / 4u;
    uint blk = e / 32u;
    i8x8(WBUF[b], WBUF[b + 1], half_at(WBUF[pl.y + blk / 2u], blk & 1u), lo, hi);
#elif defined(FMT_Q5_0)
    uint blk = e / 32u, o = e % 32u;
    uint qb = pl.x + (blk * 16u + (o & 15u)) / 4u;
    uvec2 q = uvec2(WBUF[qb], WBUF[qb + 1]);
    uint sh = o >= 16u ? 4u : 0u;
    uint qh = WBUF[pl.y + blk] >> o;
    float d = half_at(WBUF[pl.z + blk / 2u], blk & 1u);
    float v[8];
    for (uint i = 0u; i < 8u; ++i) {
        v[i] = float(int(((byte_of(q, i) >> sh) & 0xFu) | (((qh >> i) & 1u) << 4)) - 16);
    }
    lo = d * vec4(v[0], v[1], v[2], v[3]);
    hi = d * vec4(v[4], v[5], v[6], v[7]);
#elif defined(FMT_Q4_K)
    uint sb = e / 256u, r = e % 256u, sub = r / 32u;
    uint qb = pl.x + (sb * 128u + (r / 64u) * 32u + (r % 32u)) / 4u;
    uvec2 q = uvec2(WBUF[qb], WBUF[qb + 1]);
    uint sh = (sub & 1u) * 4u;
    uint s0 = WBUF[pl.y + sb * 3u], s1 = WBUF[pl.y + sb * 3u + 1u], s2 = WBUF[pl.y + sb * 3u + 2u];
    uvec4 sa = uvec4(s0 & 0xFFu, (s0 >> 8) & 0xFFu, (s0 >> 16) & 0xFFu, s0 >> 24);
    uvec4 sbb = uvec4(s1 & 0xFFu, (s1 >> 8) & 0xFFu, (s1 >> 16) & 0xFFu, s1 >> 24);
    uvec4 sc8 = uvec4(s2 & 0xFFu, (s2 >> 8) & 0xFFu, (s2 >> 16) & 0xFFu, s2 >> 24);
    uint scale, mn;
    if (sub < 4u) {
        scale = sa[sub] & 63u;
        mn = sbb[sub] & 63u;
    } else {
        scale = (sc8[sub - 4u] & 0xFu) | ((sa[sub - 4u] >> 6) << 4);
        mn = (sc8[sub - 4u] >> 4) | ((sbb[sub - 4u] >> 6) << 4);
    }
    vec2 dm = unpackHalf2x16(WBUF[pl.z + sb]);
    float d = dm.x * float(scale), m = dm.y * float(mn);
    float v[8];
    for (uint i = 0u; i < 8u; ++i) v[i] = float((byte_of(q, i) >> sh) & 0xFu);
    lo = d * vec4(v[0], v[1], v[2], v[3]) - m;
    hi = d * vec4(v[4], v[5], v[6], v[7]) - m;
#elif defined(FMT_Q6_K)
    uint sb = e / 256u, r = e % 256u, h = r / 128u, rr = r % 128u, qd = rr / 32u, l = rr % 32u;
    uint lb = pl.x + (sb * 128u + h * 64u + (qd & 1u) * 32u + l) / 4u;
    uint hb = pl.y + (sb * 64u + h * 32u + l) / 4u;
    uvec2 ql = uvec2(WBUF[lb], WBUF[lb + 1]);
    uvec2 qh = uvec2(WBUF[hb], WBUF[hb + 1]);
    uint lsh = (qd >> 1) * 4u, hsh = qd * 2u;
    uint si = sb * 16u + h * 8u + l / 16u + qd * 2u;
    int sc = bitfieldExtract(int(WBUF[pl.z + si / 4u]), int((si & 3u) * 8u), 8);
    float d = half_at(WBUF[pl.w + sb / 2u], sb & 1u) * float(sc);
    float v[8];
    for (uint i = 0u; i < 8u; ++i) {
        v[i] = float(int(((byte_of(ql, i) >> lsh) & 0xFu) | (((byte_of(qh, i) >> hsh) & 3u) << 4)) - 32);
    }
    lo = d * vec4(v[0], v[1], v[2], v[3]);
    hi = d * vec4(v[4], v[5], v[6], v[7]);
#elif defined(FMT_I8)
    uint b = pl.x + e / 4u;
    i8x8(WBUF[b], WBUF[b + 1], uintBitsToFloat(WBUF[pl.y + row]), lo, hi);
#elif defined(FMT_I4)
    const uint HALF = I4_GROUP / 2u;
    uint col = 8u * c, g = col / I4_GROUP, o = col % I4_GROUP;
    uint byte0 = row * (K / 2u) + g * HALF + (o % HALF);
    uvec2 q = uvec2(WBUF[pl.x + byte0 / 4u], WBUF[pl.x + byte0 / 4u + 1u]);
    uint sh = o >= HALF ? 4u : 0u;
    uint gi = row * (K / I4_GROUP) + g;
    float d = half_at(WBUF[pl.y + gi / 2u], gi & 1u);
#ifdef I4_ASYM
    float z = float((WBUF[pl.z + gi / 4u] >> ((gi & 3u) * 8u)) & 0xFFu);
#else
    float z = 8.0;
#endif
    float v[8];
    for (uint i = 0u; i < 8u; ++i) v[i] = float((byte_of(q, i) >> sh) & 0xFu) - z;
    lo = d * vec4(v[0], v[1], v[2], v[3]);
    hi = d * vec4(v[4], v[5], v[6], v[7]);
#else
#error "no weight format defined (FMT_F32, FMT_F16, FMT_BF16, FMT_Q8_0, FMT_Q5_0, FMT_Q4_K, FMT_Q6_K)"
#endif
}
