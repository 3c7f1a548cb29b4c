#version 450
// Prefill projection Y[m, row0 + n] = sum_k X[m, k] * W[n, k] on cooperative matrices (tensor cores /
// WMMA): fp16 inputs, fp32 accumulation. A workgroup of SUBGROUPS subgroups computes a BM x BN tile
// (BM = WM * TM * 16 tokens, BN = (SUBGROUPS / WM) * TN * 16 weight rows); per step it stages BK (32 or
// 64) columns of X and of the dequantized weight (dequantization fused into the tile load) in shared memory
// as fp16, four values per store, and each subgroup multiplies its TM x TN grid of 16x16 matrices. The
// next step's words are loaded into registers before this step's products and decoded only after them
// (DEQ8_FETCH / DEQ8_DECODE), so no instruction waits on a global load ahead of the matrix work (one barrier
// pair per step). Whole 16x16 results go straight to the arena; those cut by the edges go through one
// shared 16x16 staging tile, bounds-checked. K must be a multiple of 32. Activations beyond the fp16 range are
// clamped to +-65504 (a documented difference from the fp32 kernel, matmul.comp). X_F16: X arrives as fp16
// (converted once per input by eltwise.comp's OP_TO_F16, shared by the projections that read it), half the
// bytes and registers of the fp32 loads and no conversion per tile (matmul_coop.x16). The shared tiles are
// arrays of f16vec4, so cooperative-matrix offsets and strides below count 4-value elements.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "common.glsl"
#ifdef X_F16
// X as fp16 (eltwise.comp OP_TO_F16, once per input): four halves a load, x_off in floats, x_stride in halves
layout(binding = 1) readonly buffer ArenaX16 { uvec2 actx2[]; };
#endif
#define WBUF w32
#define DEQ8 deq_a
#define DEQ8_FETCH deq_fetch
#define DEQ8_DECODE deq_decode
#include "quant.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint WM = 2;
layout(constant_id = 2) const uint TM = 2;
layout(constant_id = 3) const uint TN = 2;
layout(constant_id = 4) const uint SG = 32;
layout(constant_id = 5) const uint BK = 32;  // K columns staged per step: 32 or 64
const uint SUBGROUPS = WG / SG;
const uint WN = SUBGROUPS / WM;
const uint BM = WM * TM * 16u;
const uint BN = WN * TN * 16u;
const uint SX4 = BK / 4u + 2u;  // row stride of the staging tiles in f16vec4 (16-byte aligned rows, fewer bank conflicts)
// loads per thread and step: X as vec4 (BM * BK / 4 in all), W as 8-value chunks (BN * BK / 8 in all)
const uint XL = (BM * (BK / 4u) + WG - 1u) / WG;
const uint WL = (BN * (BK / 8u) + WG - 1u) / WG;

layout(push_constant) uniform PC {
    uvec4 pl;
    uint K, N, T, row0;
    uint x_off, x_stride, y_off, y_stride;
} pc;

shared f16vec4 xs[BM * SX4];
shared f16vec4 ws[BN * SX4];
shared float edge[256];  // one 16x16 result cut by the matrix edges, staged

#define CM(use, type) coopmat<type, gl_ScopeSubgroup, 16, 16, use>

#ifdef X_F16
uvec2 xreg[XL];          // step k's X, as loaded (four halves)
#else
vec4 xreg[XL];           // step k's X, as loaded
#endif
uint wraw[WL][DEQ_RAW];  // step k's weight words, as loaded
bool wok[WL];            // the chunk lies inside W

// Registers <- the words of step k0's X and W tiles (X zero outside the matrix). Nothing here uses a loaded
// value, so the loads stay in flight through the products that follow.
void fetch_tiles(uint k0, uint m0, uint n0, uint tid) {
    [[unroll]] for (uint j = 0u; j < XL; ++j) {
        uint i = tid + j * WG;
        uint m = i / (BK / 4u), c = i % (BK / 4u);
#ifdef X_F16
        xreg[j] = uvec2(0u);
        if (i < BM * (BK / 4u) && m0 + m < pc.T) xreg[j] = actx2[(2u * pc.x_off + (m0 + m) * pc.x_stride + k0) / 4u + c];
#else
        xreg[j] = vec4(0.0);
        if (i < BM * (BK / 4u) && m0 + m < pc.T) xreg[j] = act4[(pc.x_off + (m0 + m) * pc.x_stride + k0) / 4u + c];
#endif
    }
    [[unroll]] for (uint j = 0u; j < WL; ++j) {
        uint i = tid + j * WG;
        uint n = i / (BK / 8u), c = i % (BK / 8u);
        wok[j] = i < BN * (BK / 8u) && n0 + n < pc.N;
        if (wok[j]) deq_fetch(pc.pl, pc.K, n0 + n, k0 / 8u + c, wraw[j]);
    }
}

// Shared tiles <- the registers of step k0, decoded and as fp16 (weights zero outside W).
void store_tiles(uint k0, uint n0, uint tid) {
    [[unroll]] for (uint j = 0u; j < XL; ++j) {
        uint i = tid + j * WG;
#ifdef X_F16
        if (i < BM * (BK / 4u))
            xs[(i / (BK / 4u)) * SX4 + i % (BK / 4u)] = f16vec4(unpackFloat2x16(xreg[j].x), unpackFloat2x16(xreg[j].y));
#else
        if (i < BM * (BK / 4u)) xs[(i / (BK / 4u)) * SX4 + i % (BK / 4u)] = f16vec4(clamp(xreg[j], -65504.0, 65504.0));
#endif
    }
    [[unroll]] for (uint j = 0u; j < WL; ++j) {
        uint i = tid + j * WG;
        if (i < BN * (BK / 8u)) {
            uint n = i / (BK / 8u), c = i % (BK / 8u);
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (wok[j]) deq_decode(pc.pl, pc.K, n0 + n, k0 / 8u + c, wraw[j], lo, hi);
            uint o = n * SX4 + 2u * c;
            ws[o] = f16vec4(lo);
            ws[o + 1u] = f16vec4(hi);
        }
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint wm = sg % WM, wn = sg / WM;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    CM(gl_MatrixUseAccumulator, float) acc[TM * TN];
    [[unroll]] for (uint i = 0u; i < TM * TN; ++i) acc[i] = CM(gl_MatrixUseAccumulator, float)(0.0);

    fetch_tiles(0u, m0, n0, tid);
    store_tiles(0u, n0, tid);
    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        barrier();  // step k0's shared tiles are stored
        bool more = k0 + BK < pc.K;
        if (more) fetch_tiles(k0 + BK, m0, n0, tid);  // in flight during the products below
        [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
            CM(gl_MatrixUseA, float16_t) a[TM];
            CM(gl_MatrixUseB, float16_t) b[TN];
            [[unroll]] for (uint i = 0u; i < TM; ++i)
                coopMatLoad(a[i], xs, ((wm * TM + i) * 16u) * SX4 + kk / 4u, SX4, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0u; j < TN; ++j)
                coopMatLoad(b[j], ws, ((wn * TN + j) * 16u) * SX4 + kk / 4u, SX4, gl_CooperativeMatrixLayoutColumnMajor);
            [[unroll]] for (uint i = 0u; i < TM; ++i)
                [[unroll]] for (uint j = 0u; j < TN; ++j)
                    acc[i * TN + j] = coopMatMulAdd(a[i], b[j], acc[i * TN + j]);
        }
        barrier();  // the products have read the shared tiles
        if (more) store_tiles(k0 + BK, n0, tid);
    }
    // Whole 16x16 results go straight to the arena (16-byte aligned rows). Those cut by the matrix edges go
    // through one shared 16x16 tile, one at a time: all threads copy the staged tile out, bounds-checked
    // (only workgroups on the edges take this path, and only for their cut tiles; an output whose rows are not
    // 16-byte aligned sends every tile this way: correct, slower, and no Gemma layout does).
    bool aligned = pc.y_stride % 4u == 0u && (pc.y_off + pc.row0) % 4u == 0u;
    bool whole = aligned && m0 + BM <= pc.T && n0 + BN <= pc.N;  // the same in every thread
    [[unroll]] for (uint i = 0u; i < TM; ++i)
        [[unroll]] for (uint j = 0u; j < TN; ++j) {
            uint gm = m0 + (wm * TM + i) * 16u, gn = n0 + (wn * TN + j) * 16u;
            if (gm < pc.T && gn < pc.N && (whole || (aligned && gm + 16u <= pc.T && gn + 16u <= pc.N)))
                coopMatStore(acc[i * TN + j], act, pc.y_off + gm * pc.y_stride + pc.row0 + gn, pc.y_stride,
                             gl_CooperativeMatrixLayoutRowMajor);
        }
    if (whole) return;
    for (uint s = 0u; s < SUBGROUPS; ++s)
        [[unroll]] for (uint i = 0u; i < TM; ++i)
            [[unroll]] for (uint j = 0u; j < TN; ++j) {
                // tile (i, j) of subgroup s; every condition below is the same in every thread
                uint gm = m0 + ((s % WM) * TM + i) * 16u, gn = n0 + ((s / WM) * TN + j) * 16u;
                if (gm >= pc.T || gn >= pc.N || (aligned && gm + 16u <= pc.T && gn + 16u <= pc.N)) continue;
                barrier();  // the previous staged tile has been copied out
                if (sg == s) coopMatStore(acc[i * TN + j], edge, 0u, 16u, gl_CooperativeMatrixLayoutRowMajor);
                barrier();
                for (uint e = tid; e < 256u; e += WG) {
                    uint m = gm + e / 16u, n = gn + e % 16u;
                    if (m < pc.T && n < pc.N) act[pc.y_off + m * pc.y_stride + pc.row0 + n] = edge[e];
                }
            }
}
