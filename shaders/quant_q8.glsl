// Integer dot products of quantized weights with int8-quantized activations (the Q8_ACT matvec path).
//
// Activations come from quant_act.comp: per token row, K int8 values (32-column blocks), then per block a
// vec4 (d, d * sum(q[0..15]), d * sum(q[16..31]), 0), so that x[k] ~ d * q[k] (see quant_act.comp).
// Each weight format is read in *units*: the columns one lane multiplies per iteration, chosen so that
// every byte loaded is used (16-byte loads of the planar layout of quant.glsl / weights.py):
//   Q8_0 32 columns (one block), Q5_0 32 (one block), Q4_K 32 (16 bytes: columns l0..l0+15 of a
//   sub-block pair, low nibbles, and the same of the odd sub-block, high nibbles; with Q4K_WIDE 64: all 32
//   bytes of the pair, so that each block meta loaded serves twice the weight bytes), Q6_K 64 (16 columns of
//   each of four 32-column quarters of a 128-column half), I8 32, I4 32 (16 columns of each nibble half of a
//   group).
// A unit is decoded once (UNITW_LOAD) into packed signed bytes and float scales, then dotted with each
// token's activations (unit_dot): an integer dot product (sdot4x8) sums four byte products per instruction, and offsets
// (Q4_K's minimum, the -16 / -32 / zero points) come out of the activation sums instead of per value.
//
// Include with WBUF (uint words) and WBUF4 (uvec4) set to one weight binding and UNITW_LOAD to the loader's
// name (twice for a fused gate/up pair); UNIT_COLS and unit_dot are defined on the first include. Include
// quant.glsl first: its helpers (half_at, bit4_per_byte, k4_scale_min) serve both.

#ifndef QUANT_Q8_COMMON
#define QUANT_Q8_COMMON
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (SPV_KHR_integer_dot_product) on four packed signed bytes: written as an intrinsic because the
// GLSL compilers at hand predate GL_EXT_integer_dot_product; the literal 0 is PackedVectorFormat4x8Bit
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int packed_format);

#if defined(FMT_Q6_K) || (defined(FMT_Q4_K) && defined(Q4K_WIDE))
#define UNIT_COLS 64u
#define UNIT_WORDS 16
#define UNIT_SCALES 4
#else
#define UNIT_COLS 32u
#define UNIT_WORDS 8
#define UNIT_SCALES 4
#endif

// A decoded unit: packed signed bytes (four values a word) and its scales; layout per format below.
struct UnitW {
    uint q[UNIT_WORDS];
    float sc[UNIT_SCALES];
};

// The activation pieces: 16 int8 values of block `blk` starting at column 16 * half, and the block's meta.
uvec4 xq16(uint qbase4, uint blk, uint half_) { return actu4[qbase4 + 2u * blk + half_]; }
vec4 xmeta(uint mbase4, uint blk) { return act4[mbase4 + blk]; }

int dot16(uint w0, uint w1, uint w2, uint w3, uvec4 x) {
    int s = sdot4x8(w0, x.x, 0);
    s += sdot4x8(w1, x.y, 0);
    s += sdot4x8(w2, x.z, 0);
    s += sdot4x8(w3, x.w, 0);
    return s;
}

// sum_k w[k] x[k] over unit u of a row, for one token whose int8 values start at uvec4 qbase4 and whose
// block meta starts at vec4 mbase4.
float unit_dot(UnitW w, uint u, uint qbase4, uint mbase4) {
#if defined(FMT_Q8_0) || defined(FMT_I8)
    // q: 8 words of signed bytes; sc[0] = the weight scale
    vec4 m = xmeta(mbase4, u);
    int s = dot16(w.q[0], w.q[1], w.q[2], w.q[3], xq16(qbase4, u, 0u));
    s += dot16(w.q[4], w.q[5], w.q[6], w.q[7], xq16(qbase4, u, 1u));
    return w.sc[0] * m.x * float(s);
#elif defined(FMT_Q5_0) || (defined(FMT_I4) && I4_GROUP == 32)
    // q: columns 0..15 then 16..31 of the block, unsigned 0..31 (0..15 for I4); value = d * (q - zero)
    // sc[0] = d, sc[1] = zero
    vec4 m = xmeta(mbase4, u);
    int s = dot16(w.q[0], w.q[1], w.q[2], w.q[3], xq16(qbase4, u, 0u));
    s += dot16(w.q[4], w.q[5], w.q[6], w.q[7], xq16(qbase4, u, 1u));
    return w.sc[0] * (m.x * float(s) - w.sc[1] * (m.y + m.z));
#elif defined(FMT_Q4_K) && defined(Q4K_WIDE)
    // Q4K_WIDE, unit u: superblock u / 4, sub-block pair p = u % 4, all 32 columns of each sub-block (one
    // block meta of each serves 32 bytes of weights instead of 16); q[0..3] / q[8..11]: the even sub-block's
    // columns 0..15 / 16..31 (low nibbles), q[4..7] / q[12..15]: the odd one's (high nibbles); sc as below
    uint blk = 2u * u;
    vec4 ma = xmeta(mbase4, blk), mb = xmeta(mbase4, blk + 1u);
    int ia = dot16(w.q[0], w.q[1], w.q[2], w.q[3], xq16(qbase4, blk, 0u));
    ia += dot16(w.q[8], w.q[9], w.q[10], w.q[11], xq16(qbase4, blk, 1u));
    int ib = dot16(w.q[4], w.q[5], w.q[6], w.q[7], xq16(qbase4, blk + 1u, 0u));
    ib += dot16(w.q[12], w.q[13], w.q[14], w.q[15], xq16(qbase4, blk + 1u, 1u));
    return w.sc[0] * ma.x * float(ia) - w.sc[1] * (ma.y + ma.z) + w.sc[2] * mb.x * float(ib) - w.sc[3] * (mb.y + mb.z);
#elif defined(FMT_Q4_K)
    // unit u: superblock u / 8, sub-block pair p = (u / 2) % 4, columns 16 * (u % 2) of each sub-block;
    // q[0..3]: the even sub-block (low nibbles), q[4..7]: the odd one; sc: d*scale and dmin*min of each
    uint blk = u & ~1u, h = u & 1u;  // the even sub-block's 32-column block: 8 * (u / 8) + 2 * p
    vec4 ma = xmeta(mbase4, blk), mb = xmeta(mbase4, blk + 1u);
    float sa = h == 0u ? ma.y : ma.z, sb = h == 0u ? mb.y : mb.z;
    int ia = dot16(w.q[0], w.q[1], w.q[2], w.q[3], xq16(qbase4, blk, h));
    int ib = dot16(w.q[4], w.q[5], w.q[6], w.q[7], xq16(qbase4, blk + 1u, h));
    return w.sc[0] * ma.x * float(ia) - w.sc[1] * sa + w.sc[2] * mb.x * float(ib) - w.sc[3] * sb;
#elif defined(FMT_Q6_K)
    // unit u: superblock u / 4, half hh = (u / 2) % 2, columns 16 * (u % 2) of its four 32-column quarters;
    // q[4i..4i+3]: quarter i, unsigned 0..63 (value = d * scale * (q - 32)); sc[i]: d * scale of quarter i
    uint blk0 = (u / 2u) * 4u, h = u & 1u;
    float r = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        vec4 m = xmeta(mbase4, blk0 + i);
        int s = dot16(w.q[4u * i], w.q[4u * i + 1u], w.q[4u * i + 2u], w.q[4u * i + 3u], xq16(qbase4, blk0 + i, h));
        r += w.sc[i] * (m.x * float(s) - 32.0 * (h == 0u ? m.y : m.z));
    }
    return r;
#elif defined(FMT_I4)
    // unit u: group u / (I4_GROUP / 32), columns l0..l0+15 (low nibbles) and HALF + l0.. (high nibbles) with
    // l0 = 16 * (u % (I4_GROUP / 32)); sc[0] = d, sc[1] = zero point
    const uint PER = I4_GROUP / 32u, HALF_BLKS = I4_GROUP / 64u;  // 32-column blocks in half a group
    uint g = u / PER, l = u % PER;
    uint blk_lo = g * (I4_GROUP / 32u) + l / 2u, blk_hi = blk_lo + HALF_BLKS, h = l & 1u;
    vec4 ma = xmeta(mbase4, blk_lo), mb = xmeta(mbase4, blk_hi);
    int ia = dot16(w.q[0], w.q[1], w.q[2], w.q[3], xq16(qbase4, blk_lo, h));
    int ib = dot16(w.q[4], w.q[5], w.q[6], w.q[7], xq16(qbase4, blk_hi, h));
    float sums = (h == 0u ? ma.y : ma.z) + (h == 0u ? mb.y : mb.z);
    return w.sc[0] * (ma.x * float(ia) + mb.x * float(ib) - w.sc[1] * sums);
#else
#error "Q8_ACT: no integer path for this weight format"
#endif
}
#endif  // QUANT_Q8_COMMON

// Decodes unit u of `row` (K columns) of the weight in WBUF/WBUF4 with plane word offsets pl.
UnitW UNITW_LOAD(uvec4 pl, uint K, uint row, uint u) {
    UnitW w;
#if defined(FMT_Q8_0)
    uint blk = row * (K / 32u) + u;
    uvec4 a = WBUF4[pl.x / 4u + 2u * blk], b = WBUF4[pl.x / 4u + 2u * blk + 1u];
    w.q[0] = a.x; w.q[1] = a.y; w.q[2] = a.z; w.q[3] = a.w;
    w.q[4] = b.x; w.q[5] = b.y; w.q[6] = b.z; w.q[7] = b.w;
    w.sc[0] = half_at(WBUF[pl.y + blk / 2u], blk & 1u);
    w.sc[1] = 0.0; w.sc[2] = 0.0; w.sc[3] = 0.0;
#elif defined(FMT_I8)
    uint e = row * (K / 32u) + u;
    uvec4 a = WBUF4[pl.x / 4u + 2u * e], b = WBUF4[pl.x / 4u + 2u * e + 1u];
    w.q[0] = a.x; w.q[1] = a.y; w.q[2] = a.z; w.q[3] = a.w;
    w.q[4] = b.x; w.q[5] = b.y; w.q[6] = b.z; w.q[7] = b.w;
    w.sc[0] = uintBitsToFloat(WBUF[pl.y + row]);
    w.sc[1] = 0.0; w.sc[2] = 0.0; w.sc[3] = 0.0;
#elif defined(FMT_Q5_0)
    uint blk = row * (K / 32u) + u;
    uvec4 n = WBUF4[pl.x / 4u + blk];  // 16 bytes: low nibbles columns 0..15, high nibbles 16..31
    uint qh = WBUF[pl.y + blk];        // fifth bits of the 32 columns
    uint nw[4] = uint[4](n.x, n.y, n.z, n.w);
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        w.q[i] = (nw[i] & 0x0F0F0F0Fu) | bit4_per_byte(qh >> (4u * i));
        w.q[4u + i] = ((nw[i] >> 4) & 0x0F0F0F0Fu) | bit4_per_byte(qh >> (16u + 4u * i));
    }
    w.sc[0] = half_at(WBUF[pl.z + blk / 2u], blk & 1u);
    w.sc[1] = 16.0; w.sc[2] = 0.0; w.sc[3] = 0.0;
#elif defined(FMT_Q4_K)
#ifdef Q4K_WIDE
    uint sbs = K / 256u, sb = row * sbs + u / 4u, p = u % 4u;
    uvec4 n0 = WBUF4[pl.x / 4u + sb * 8u + p * 2u], n1 = WBUF4[pl.x / 4u + sb * 8u + p * 2u + 1u];
    uint nw[8] = uint[8](n0.x, n0.y, n0.z, n0.w, n1.x, n1.y, n1.z, n1.w);
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        w.q[i] = nw[i] & 0x0F0F0F0Fu;
        w.q[4u + i] = (nw[i] >> 4) & 0x0F0F0F0Fu;
        w.q[8u + i] = nw[4u + i] & 0x0F0F0F0Fu;
        w.q[12u + i] = (nw[4u + i] >> 4) & 0x0F0F0F0Fu;
    }
#else
    uint sbs = K / 256u, sb = row * sbs + u / 8u, p = (u / 2u) % 4u, h = u & 1u;
    uvec4 n = WBUF4[pl.x / 4u + sb * 8u + p * 2u + h];
    uint nw[4] = uint[4](n.x, n.y, n.z, n.w);
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        w.q[i] = nw[i] & 0x0F0F0F0Fu;
        w.q[4u + i] = (nw[i] >> 4) & 0x0F0F0F0Fu;
    }
#endif
    uint s0 = WBUF[pl.y + sb * 3u], s1 = WBUF[pl.y + sb * 3u + 1u], s2 = WBUF[pl.y + sb * 3u + 2u];
    vec2 dm = unpackHalf2x16(WBUF[pl.z + sb]);
    [[unroll]] for (uint k = 0u; k < 2u; ++k) {
        uvec2 sm = k4_scale_min(s0, s1, s2, 2u * p + k);
        w.sc[2u * k] = dm.x * float(sm.x);
        w.sc[2u * k + 1u] = dm.y * float(sm.y);
    }
#elif defined(FMT_Q6_K)
    uint sbs = K / 256u, sb = row * sbs + u / 4u, hh = (u / 2u) % 2u, h = u & 1u;
    // ql: 128 bytes a superblock (8 uvec4): bytes hh*64 + [0, 32) hold quarters 0 (low) and 2 (high),
    // hh*64 + [32, 64) quarters 1 (low) and 3 (high); qh: 64 bytes (4 uvec4), bytes hh*32 + [0, 32) hold
    // two bits of each quarter
    uvec4 l0 = WBUF4[pl.x / 4u + sb * 8u + hh * 4u + h];
    uvec4 l1 = WBUF4[pl.x / 4u + sb * 8u + hh * 4u + 2u + h];
    uvec4 hb = WBUF4[pl.y / 4u + sb * 4u + hh * 2u + h];
    uint a[4] = uint[4](l0.x, l0.y, l0.z, l0.w), b[4] = uint[4](l1.x, l1.y, l1.z, l1.w);
    uint c[4] = uint[4](hb.x, hb.y, hb.z, hb.w);
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        w.q[i] = (a[i] & 0x0F0F0F0Fu) | ((c[i] & 0x03030303u) << 4);
        w.q[4u + i] = (b[i] & 0x0F0F0F0Fu) | (((c[i] >> 2) & 0x03030303u) << 4);
        w.q[8u + i] = ((a[i] >> 4) & 0x0F0F0F0Fu) | (((c[i] >> 4) & 0x03030303u) << 4);
        w.q[12u + i] = ((b[i] >> 4) & 0x0F0F0F0Fu) | (((c[i] >> 6) & 0x03030303u) << 4);
    }
    // scales: 16 signed bytes a superblock; quarter i of this unit uses byte hh*8 + h + 2*i
    uint sw0 = WBUF[pl.z + sb * 4u + hh * 2u], sw1 = WBUF[pl.z + sb * 4u + hh * 2u + 1u];
    float d = half_at(WBUF[pl.w + sb / 2u], sb & 1u);
    w.sc[0] = d * float(bitfieldExtract(int(sw0), int(8u * h), 8));
    w.sc[1] = d * float(bitfieldExtract(int(sw0), int(8u * h + 16u), 8));
    w.sc[2] = d * float(bitfieldExtract(int(sw1), int(8u * h), 8));
    w.sc[3] = d * float(bitfieldExtract(int(sw1), int(8u * h + 16u), 8));
#elif defined(FMT_I4)
    const uint PER = I4_GROUP / 32u, HALF = I4_GROUP / 2u;
    uint g = u / PER, l = u % PER;
    uint byte0 = row * (K / 2u) + g * HALF + 16u * l;
    uvec4 n = WBUF4[pl.x / 4u + byte0 / 16u];
    uint nw[4] = uint[4](n.x, n.y, n.z, n.w);
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        w.q[i] = nw[i] & 0x0F0F0F0Fu;
        w.q[4u + i] = (nw[i] >> 4) & 0x0F0F0F0Fu;
    }
    uint gi = row * (K / I4_GROUP) + g;
    w.sc[0] = half_at(WBUF[pl.y + gi / 2u], gi & 1u);
#ifdef I4_ASYM
    w.sc[1] = float((WBUF[pl.z + gi / 4u] >> ((gi & 3u) * 8u)) & 0xFFu);
#else
    w.sc[1] = 8.0;
#endif
    w.sc[2] = 0.0; w.sc[3] = 0.0;
#endif
    return w;
}
