// The body of the weight decoders of quant.glsl: decodes the 8 values at columns 8c..8c+7 of `row` into lo, hi.
// Every weight word it reads is WREAD(i, address), i < DEQ_RAW numbering the reads of one format, so the
// includer compiles it as one decoder (WREAD = the load), as a fetch (WREAD stores the load in raw[i]) or as
// a decode of fetched words (WREAD = raw[i]): one source for the three.
    uint e = row * K + 8u * c;
#if defined(FMT_F32)
    uint b = pl.x + e;
    lo = vec4(uintBitsToFloat(WREAD(0, b)), uintBitsToFloat(WREAD(1, b + 1)), uintBitsToFloat(WREAD(2, b + 2)), uintBitsToFloat(WREAD(3, b + 3)));
    hi = vec4(uintBitsToFloat(WREAD(4, b + 4)), uintBitsToFloat(WREAD(5, b + 5)), uintBitsToFloat(WREAD(6, b + 6)), uintBitsToFloat(WREAD(7, b + 7)));
#elif defined(FMT_F16)
    uint b = pl.x + e / 2u;
    lo = vec4(unpackHalf2x16(WREAD(0, b)), unpackHalf2x16(WREAD(1, b + 1)));
    hi = vec4(unpackHalf2x16(WREAD(2, b + 2)), unpackHalf2x16(WREAD(3, b + 3)));
#elif defined(FMT_BF16)
    uint b = pl.x + e / 2u;
    uvec4 w = uvec4(WREAD(0, b), WREAD(1, b + 1), WREAD(2, b + 2), WREAD(3, b + 3));
    lo = vec4(uintBitsToFloat(w.x << 16), uintBitsToFloat(w.x & 0xFFFF0000u), uintBitsToFloat(w.y << 16), uintBitsToFloat(w.y & 0xFFFF0000u));
    hi = vec4(uintBitsToFloat(w.z << 16), uintBitsToFloat(w.z & 0xFFFF0000u), uintBitsToFloat(w.w << 16), uintBitsToFloat(w.w & 0xFFFF0000u));
#elif defined(FMT_Q8_0)
    uint b = pl.x + e / 4u;
    uint blk = e / 32u;
    i8x8(WREAD(0, b), WREAD(1, b + 1), half_at(WREAD(2, pl.y + blk / 2u), blk & 1u), lo, hi);
#elif defined(FMT_Q5_0)
    uint blk = e / 32u, o = e % 32u;
    uint qb = pl.x + (blk * 16u + (o & 15u)) / 4u;
    uint sh = o >= 16u ? 4u : 0u;
    uint qh = WREAD(0, pl.y + blk) >> o;  // the fifth bits of columns o..o+7 in bits 0..7
    float d = half_at(WREAD(1, pl.z + blk / 2u), blk & 1u);
    uint n0 = ((WREAD(2, qb) >> sh) & 0x0F0F0F0Fu) | bit4_per_byte(qh);  // four 5-bit values per word
    uint n1 = ((WREAD(3, qb + 1) >> sh) & 0x0F0F0F0Fu) | bit4_per_byte(qh >> 4);
    lo = d * (bytes4(n0) - 16.0);
    hi = d * (bytes4(n1) - 16.0);
#elif defined(FMT_Q4_K)
    uint sb = e / 256u, r = e % 256u, sub = r / 32u;
    uint qb = pl.x + (sb * 128u + (r / 64u) * 32u + (r % 32u)) / 4u;
    uint sh = (sub & 1u) * 4u;
    uint s0 = WREAD(0, pl.y + sb * 3u), s1 = WREAD(1, pl.y + sb * 3u + 1u), s2 = WREAD(2, pl.y + sb * 3u + 2u);
    uvec2 sm = k4_scale_min(s0, s1, s2, sub);
    vec2 dm = unpackHalf2x16(WREAD(3, pl.z + sb));
    float d = dm.x * float(sm.x), m = dm.y * float(sm.y);
    lo = d * bytes4((WREAD(4, qb) >> sh) & 0x0F0F0F0Fu) - m;
    hi = d * bytes4((WREAD(5, qb + 1) >> sh) & 0x0F0F0F0Fu) - m;
#elif defined(FMT_Q6_K)
    uint sb = e / 256u, r = e % 256u, h = r / 128u, rr = r % 128u, qd = rr / 32u, l = rr % 32u;
    uint lb = pl.x + (sb * 128u + h * 64u + (qd & 1u) * 32u + l) / 4u;
    uint hb = pl.y + (sb * 64u + h * 32u + l) / 4u;
    uint lsh = (qd >> 1) * 4u, hsh = qd * 2u;
    uint si = sb * 16u + h * 8u + l / 16u + qd * 2u;
    int sc = bitfieldExtract(int(WREAD(0, pl.z + si / 4u)), int((si & 3u) * 8u), 8);
    float d = half_at(WREAD(1, pl.w + sb / 2u), sb & 1u) * float(sc);
    // four 6-bit values per word: low nibbles from ql, the two high bits from qh
    uint n0 = ((WREAD(2, lb) >> lsh) & 0x0F0F0F0Fu) | (((WREAD(3, hb) >> hsh) & 0x03030303u) << 4);
    uint n1 = ((WREAD(4, lb + 1) >> lsh) & 0x0F0F0F0Fu) | (((WREAD(5, hb + 1) >> hsh) & 0x03030303u) << 4);
    lo = d * (bytes4(n0) - 32.0);
    hi = d * (bytes4(n1) - 32.0);
#elif defined(FMT_I8)
    uint b = pl.x + e / 4u;
    i8x8(WREAD(0, b), WREAD(1, b + 1), uintBitsToFloat(WREAD(2, pl.y + row)), lo, hi);
#elif defined(FMT_I4)
    const uint HALF = I4_GROUP / 2u;
    uint col = 8u * c, g = col / I4_GROUP, o = col % I4_GROUP;
    uint byte0 = row * (K / 2u) + g * HALF + (o % HALF);
    uint sh = o >= HALF ? 4u : 0u;
    uint gi = row * (K / I4_GROUP) + g;
    float d = half_at(WREAD(0, pl.y + gi / 2u), gi & 1u);
#ifdef I4_ASYM
    float z = float((WREAD(1, pl.z + gi / 4u) >> ((gi & 3u) * 8u)) & 0xFFu);
#else
    float z = 8.0;
#endif
    uint qw = pl.x + byte0 / 4u;
    lo = d * (bytes4((WREAD(2, qw) >> sh) & 0x0F0F0F0Fu) - z);
    hi = d * (bytes4((WREAD(3, qw + 1u) >> sh) & 0x0F0F0F0Fu) - z);
#else
#error "no weight format defined (FMT_F32, FMT_F16, FMT_BF16, FMT_Q8_0, FMT_Q5_0, FMT_Q4_K, FMT_Q6_K, FMT_I8, FMT_I4)"
#endif
