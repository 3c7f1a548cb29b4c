#version 450
// Prefill projection Y[m, row0 + n] = sum_k X[m, k] * W[n, k] on cooperative matrices (tensor cores /
// WMMA): fp16 inputs, fp32 accumulation. A workgroup of SUBGROUPS subgroups computes a BM x BN tile
// (BM = WM * TM * 16 tokens, BN = (SUBGROUPS / WM) * TN * 16 weight rows); per step it stages BK = 32
// columns of X and of the dequantized weight in shared memory as fp16, and each subgroup multiplies its
// TM x TN grid of 16x16 matrices. Results go through shared memory so that edges are bounds-checked.
// K must be a multiple of 32. Activations beyond the fp16 range are clamped to +-65504 (a deliberate,
// documented difference from the fp32 kernel, matmul.comp).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "common.glsl"
#define WBUF w32
#define DEQ8 deq_a
#include "quant.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint WM = 2;
layout(constant_id = 2) const uint TM = 2;
layout(constant_id = 3) const uint TN = 2;
layout(constant_id = 4) const uint SG = 32;
const uint SUBGROUPS = WG / SG;
const uint WN = SUBGROUPS / WM;
const uint BM = WM * TM * 16u;
const uint BN = WN * TN * 16u;
const uint BK = 32;
const uint SX = BK + 8u;   // row stride of the fp16 staging tiles (16-byte aligned rows, fewer bank conflicts)
const uint SC = BN + 4u;   // row stride of the fp32 result tile

layout(push_constant) uniform PC {
    uvec4 pl;
    uint K, N, T, row0;
    uint x_off, x_stride, y_off, y_stride;
} pc;

shared float16_t xs[BM * SX];
shared float16_t ws[BN * SX];
shared float cs[BM * SC];

#define CM(use, type) coopmat<type, gl_ScopeSubgroup, 16, 16, use>

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint wm = sg % WM, wn = sg / WM;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    CM(gl_MatrixUseAccumulator, float) acc[TM * TN];
    [[unroll]] for (uint i = 0u; i < TM * TN; ++i) acc[i] = CM(gl_MatrixUseAccumulator, float)(0.0);

    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        for (uint i = tid; i < BM * (BK / 4u); i += WG) {
            uint m = i / (BK / 4u), c = i % (BK / 4u);
            uint gm = m0 + m;
            vec4 v = vec4(0.0);
            if (gm < pc.T) {
                uint base = pc.x_off + gm * pc.x_stride + k0 + 4u * c;
                v = vec4(act[base], act[base + 1u], act[base + 2u], act[base + 3u]);
            }
            v = clamp(v, -65504.0, 65504.0);
            uint o = m * SX + 4u * c;
            xs[o] = float16_t(v.x);
            xs[o + 1u] = float16_t(v.y);
            xs[o + 2u] = float16_t(v.z);
            xs[o + 3u] = float16_t(v.w);
        }
        for (uint i = tid; i < BN * (BK / 8u); i += WG) {
            uint n = i / (BK / 8u), c = i % (BK / 8u);
            uint gn = n0 + n;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (gn < pc.N) deq_a(pc.pl, pc.K, gn, k0 / 8u + c, lo, hi);
            uint o = n * SX + 8u * c;
            [[unroll]] for (uint e = 0u; e < 4u; ++e) {
                ws[o + e] = float16_t(lo[e]);
                ws[o + 4u + e] = float16_t(hi[e]);
            }
        }
        barrier();
        [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
            CM(gl_MatrixUseA, float16_t) a[TM];
            CM(gl_MatrixUseB, float16_t) b[TN];
            [[unroll]] for (uint i = 0u; i < TM; ++i)
                coopMatLoad(a[i], xs, ((wm * TM + i) * 16u) * SX + kk, SX, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0u; j < TN; ++j)
                coopMatLoad(b[j], ws, ((wn * TN + j) * 16u) * SX + kk, SX, gl_CooperativeMatrixLayoutColumnMajor);
            [[unroll]] for (uint i = 0u; i < TM; ++i)
                [[unroll]] for (uint j = 0u; j < TN; ++j)
                    acc[i * TN + j] = coopMatMulAdd(a[i], b[j], acc[i * TN + j]);
        }
        barrier();
    }
    [[unroll]] for (uint i = 0u; i < TM; ++i)
        [[unroll]] for (uint j = 0u; j < TN; ++j)
            coopMatStore(acc[i * TN + j], cs, ((wm * TM + i) * 16u) * SC + (wn * TN + j) * 16u, SC,
                         gl_CooperativeMatrixLayoutRowMajor);
    barrier();
    for (uint i = tid; i < BM * BN; i += WG) {
        uint m = i / BN, n = i % BN;
        uint gm = m0 + m, gn = n0 + n;
        if (gm < pc.T && gn < pc.N) act[pc.y_off + gm * pc.y_stride + pc.row0 + gn] = cs[m * SC + n];
    }
}
