#version 450
// Prefill projection Y[m, row0 + n] = sum_k X[m, k] * W[n, k] as a tiled GEMM: each workgroup computes a
// BM x BN tile (BM = WG_M * TM tokens, BN = (WG / WG_M) * TN weight rows), staging BK = 32 columns of X
// and of the dequantized weight in shared memory per step. K must be a multiple of 32.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define WBUF w32
#define DEQ8 deq_a
#define DEQ8_FETCH deq_fetch
#define DEQ8_DECODE deq_decode
#include "quant.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint WG_M = 16;
layout(constant_id = 2) const uint TM = 4;
layout(constant_id = 3) const uint TN = 4;
const uint WG_N = WG / WG_M;
const uint BM = WG_M * TM;
const uint BN = WG_N * TN;
const uint BK = 32;
#define MAX_TM 8
#define MAX_TN 8

layout(push_constant) uniform PC {
    uvec4 pl;
    uint K, N, T, row0;
    uint x_off, x_stride, y_off, y_stride;
} pc;

shared float xs[BK * (BM + 1)];
shared float ws[BK * (BN + 1)];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tm = tid % WG_M, tn = tid / WG_M;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    float acc[MAX_TM][MAX_TN];
    for (uint i = 0u; i < TM; ++i)
        for (uint j = 0u; j < TN; ++j) acc[i][j] = 0.0;
    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        for (uint i = tid; i < BM * BK; i += WG) {
            uint m = i / BK, kk = i % BK;
            uint gm = m0 + m;
            xs[kk * (BM + 1) + m] = gm < pc.T ? act[pc.x_off + gm * pc.x_stride + k0 + kk] : 0.0;
        }
        for (uint i = tid; i < BN * (BK / 8u); i += WG) {
            uint n = i / (BK / 8u), cc = i % (BK / 8u);
            uint gn = n0 + n;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (gn < pc.N) {  // the split decoder (as matmul_coop.comp runs it), so lavapipe checks it too
                uint raw[DEQ_RAW];
                deq_fetch(pc.pl, pc.K, gn, k0 / 8u + cc, raw);
                deq_decode(pc.pl, pc.K, gn, k0 / 8u + cc, raw, lo, hi);
            }
            uint kb = cc * 8u;
            for (uint e = 0u; e < 4u; ++e) {
                ws[(kb + e) * (BN + 1) + n] = lo[e];
                ws[(kb + 4u + e) * (BN + 1) + n] = hi[e];
            }
        }
        barrier();
        for (uint kk = 0u; kk < BK; ++kk) {
            float a[MAX_TM], b[MAX_TN];
            for (uint i = 0u; i < TM; ++i) a[i] = xs[kk * (BM + 1) + tm + i * WG_M];
            for (uint j = 0u; j < TN; ++j) b[j] = ws[kk * (BN + 1) + tn + j * WG_N];
            for (uint i = 0u; i < TM; ++i)
                for (uint j = 0u; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }
    for (uint i = 0u; i < TM; ++i) {
        uint gm = m0 + tm + i * WG_M;
        if (gm >= pc.T) continue;
        for (uint j = 0u; j < TN; ++j) {
            uint gn = n0 + tn + j * WG_N;
            if (gn < pc.N) act[pc.y_off + gm * pc.y_stride + pc.row0 + gn] = acc[i][j];
        }
    }
}
