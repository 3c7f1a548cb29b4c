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
float half_at(uint word, uint which) { return unpackHalf2x16(word)[which]; }
// the 4 unsigned bytes of a word as floats
vec4 bytes4(uint w) { return vec4(uvec4(w, w >> 8, w >> 16, w >> 24) & 0xFFu); }
// bits 0..3 of x to bit 4 of bytes 0..3 (the multiply puts copies of x 7 bits apart: bit k lands on bit 8k)
uint bit4_per_byte(uint x) { return (((x & 0xFu) * 0x204081u) & 0x01010101u) << 4; }
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
    uint sh = o >= 16u ? 4u : 0u;
    uint qh = WBUF[pl.y + blk] >> o;  // the fifth bits of columns o..o+7 in bits 0..7
    float d = half_at(WBUF[pl.z + blk / 2u], blk & 1u);
    uint n0 = ((WBUF[qb] >> sh) & 0x0F0F0F0Fu) | bit4_per_byte(qh);  // four 5-bit values per word
    uint n1 = ((WBUF[qb + 1] >> sh) & 0x0F0F0F0Fu) | bit4_per_byte(qh >> 4);
    lo = d * (bytes4(n0) - 16.0);
    hi = d * (bytes4(n1) - 16.0);
#elif defined(FMT_Q4_K)
    uint sb = e / 256u, r = e % 256u, sub = r / 32u;
    uint qb = pl.x + (sb * 128u + (r / 64u) * 32u + (r % 32u)) / 4u;
    uint sh = (sub & 1u) * 4u;
    uint s0 = WBUF[pl.y + sb * 3u], s1 = WBUF[pl.y + sb * 3u + 1u], s2 = WBUF[pl.y + sb * 3u + 2u];
    uint scale, mn;  // 6-bit scale and min of the sub-block (llama.cpp's get_scale_min_k4 packing)
    if (sub < 4u) {
        scale = bitfieldExtract(s0, int(8u * sub), 6);
        mn = bitfieldExtract(s1, int(8u * sub), 6);
    } else {
        int j = int(8u * (sub - 4u));
        scale = bitfieldExtract(s2, j, 4) | (bitfieldExtract(s0, j + 6, 2) << 4);
        mn = bitfieldExtract(s2, j + 4, 4) | (bitfieldExtract(s1, j + 6, 2) << 4);
    }
    vec2 dm = unpackHalf2x16(WBUF[pl.z + sb]);
    float d = dm.x * float(scale), m = dm.y * float(mn);
    lo = d * bytes4((WBUF[qb] >> sh) & 0x0F0F0F0Fu) - m;
    hi = d * bytes4((WBUF[qb + 1] >> sh) & 0x0F0F0F0Fu) - m;
#elif defined(FMT_Q6_K)
    uint sb = e / 256u, r = e % 256u, h = r / 128u, rr = r % 128u, qd = rr / 32u, l = rr % 32u;
    uint lb = pl.x + (sb * 128u + h * 64u + (qd & 1u) * 32u + l) / 4u;
    uint hb = pl.y + (sb * 64u + h * 32u + l) / 4u;
    uint lsh = (qd >> 1) * 4u, hsh = qd * 2u;
    uint si = sb * 16u + h * 8u + l / 16u + qd * 2u;
    int sc = bitfieldExtract(int(WBUF[pl.z + si / 4u]), int((si & 3u) * 8u), 8);
    float d = half_at(WBUF[pl.w + sb / 2u], sb & 1u) * float(sc);
    // four 6-bit values per word: low nibbles from ql, the two high bits from qh
    uint n0 = ((WBUF[lb] >> lsh) & 0x0F0F0F0Fu) | (((WBUF[hb] >> hsh) & 0x03030303u) << 4);
    uint n1 = ((WBUF[lb + 1] >> lsh) & 0x0F0F0F0Fu) | (((WBUF[hb + 1] >> hsh) & 0x03030303u) << 4);
    lo = d * (bytes4(n0) - 32.0);
    hi = d * (bytes4(n1) - 32.0);
#elif defined(FMT_I8)
    uint b = pl.x + e / 4u;
    i8x8(WBUF[b], WBUF[b + 1], uintBitsToFloat(WBUF[pl.y + row]), lo, hi);
#elif defined(FMT_I4)
    const uint HALF = I4_GROUP / 2u;
    uint col = 8u * c, g = col / I4_GROUP, o = col % I4_GROUP;
    uint byte0 = row * (K / 2u) + g * HALF + (o % HALF);
    uint sh = o >= HALF ? 4u : 0u;
    uint gi = row * (K / I4_GROUP) + g;
    float d = half_at(WBUF[pl.y + gi / 2u], gi & 1u);
#ifdef I4_ASYM
    float z = float((WBUF[pl.z + gi / 4u] >> ((gi & 3u) * 8u)) & 0xFFu);
#else
    float z = 8.0;
#endif
    uint qw = pl.x + byte0 / 4u;
    lo = d * (bytes4((WBUF[qw] >> sh) & 0x0F0F0F0Fu) - z);
    hi = d * (bytes4((WBUF[qw + 1u] >> sh) & 0x0F0F0F0Fu) - z);
#else
#error "no weight format defined (FMT_F32, FMT_F16, FMT_BF16, FMT_Q8_0, FMT_Q5_0, FMT_Q4_K, FMT_Q6_K)"
#endif
}
