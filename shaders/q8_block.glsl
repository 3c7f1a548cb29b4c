// One 32-value block of activations to int8 (shared by quant_act.comp and matvec.comp's QUANT_OUT tail):
// d = max|v| / 127, q = roundEven(v / d) (ties to even, as numpy), written as two uvec4 of packed bytes at
// uvec4 index qb + 2 * blk and its meta vec4 (d, d * sum(q[0..15]), d * sum(q[16..31]), 0) at mb + blk.
// Needs the arena aliases actu4 and act4 (common.glsl with QUANT_ACT or Q8_ACT defined).
void store_q8_block(float v[32], uint qb, uint mb, uint blk) {
    float amax = 0.0;
    [[unroll]] for (uint i = 0u; i < 32u; ++i) amax = max(amax, abs(v[i]));
    float d = amax / 127.0, id = amax > 0.0 ? 127.0 / amax : 0.0;
    uint words[8];
    int sums[2] = int[2](0, 0);
    [[unroll]] for (uint w = 0u; w < 8u; ++w) {
        uint packed = 0u;
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            int q = clamp(int(roundEven(v[4u * w + b] * id)), -127, 127);
            sums[w / 4u] += q;
            packed |= (uint(q) & 0xFFu) << (8u * b);
        }
        words[w] = packed;
    }
    actu4[qb + 2u * blk] = uvec4(words[0], words[1], words[2], words[3]);
    actu4[qb + 2u * blk + 1u] = uvec4(words[4], words[5], words[6], words[7]);
    act4[mb + blk] = vec4(d, d * float(sums[0]), d * float(sums[1]), 0.0);
}
