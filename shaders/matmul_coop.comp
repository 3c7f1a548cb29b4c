#version 450
// Prefill projection Y[m, row0 + n] = sum_k X[m, k] * W[n, k] on cooperative matrices (tensor cores /
// WMMA): fp16 inputs, fp32 accumulation. A workgroup of SUBGROUPS subgroups computes a BM x BN tile
// (BM = WM * TM * 16 tokens, BN = (SUBGROUPS / WM) * TN * 16 weight rows); per step it stages BK (32 or
// 64) columns of X and of the dequantized weight (dequantization fused into the tile load) in shared memory
// as fp16, four values per store, and each subgroup multiplies its TM x TN grid of 16x16 matrices. The
// next step's words are loaded into registers before this step's products and decoded only after them
// (DEQ8_FETCH / DEQ8_DECODE), so no instruction waits on a global load ahead of the matrix work (one barrier
// pair per step). With AHEAD = 1 the weights run one step further ahead: step k+2's words are loaded and
// step k+1's decoded (into registers, as fp16) between step k's products, so the decoding overlaps the
// matrix work of the same subgroup and only shared stores remain between the barriers (matmul_coop.ahead).
// Whole 16x16 results go straight to the arena; those cut by the edges go through one
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
layout(constant_id = 6) const uint AHEAD = 0;  // 1: decode step k+1's weights between step k's products
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
uint wraw[WL][DEQ_RAW];  // step k's weight words, as loaded (AHEAD: step k+2's)
bool wok[WL];            // the chunk lies inside W (the same at every step)
f16vec4 wdec[WL][2];     // AHEAD: step k+1's weights, decoded

// Registers <- the words of step k0's X tile (zero outside the matrix). Nothing here uses a loaded value, so
// the loads stay in flight through the products that follow.
void fetch_x(uint k0, uint m0, uint tid) {
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
}

// Registers <- the words of step k0's W tile (the chunks outside W are not loaded: wok).
void fetch_w(uint k0, uint n0, uint tid) {
    [[unroll]] for (uint j = 0u; j < WL; ++j) {
        uint i = tid + j * WG;
        uint n = i / (BK / 8u), c = i % (BK / 8u);
        wok[j] = i < BN * (BK / 8u) && n0 + n < pc.N;
        if (wok[j]) deq_fetch(pc.pl, pc.K, n0 + n, k0 / 8u + c, wraw[j]);
    }
}

// Chunk j of step k0's W tile, decoded from its loaded words (zero outside W).
void decode_chunk(uint j, uint k0, uint n0, uint tid, out vec4 lo, out vec4 hi) {
    uint i = tid + j * WG;
    uint n = i / (BK / 8u), c = i % (BK / 8u);
    lo = vec4(0.0);
    hi = vec4(0.0);
    if (wok[j]) deq_decode(pc.pl, pc.K, n0 + n, k0 / 8u + c, wraw[j], lo, hi);
}

// Shared X tile <- the registers of step k0's X, as fp16.
void store_x(uint tid) {
    [[unroll]] for (uint j = 0u; j < XL; ++j) {
        uint i = tid + j * WG;
#ifdef X_F16
        if (i < BM * (BK / 4u))
            xs[(i / (BK / 4u)) * SX4 + i % (BK / 4u)] = f16vec4(unpackFloat2x16(xreg[j].x), unpackFloat2x16(xreg[j].y));
#else
        if (i < BM * (BK / 4u)) xs[(i / (BK / 4u)) * SX4 + i % (BK / 4u)] = f16vec4(clamp(xreg[j], -65504.0, 65504.0));
#endif
    }
}

// Shared W tile, chunk j <- its 8 values as fp16.
void store_w(uint j, uint tid, f16vec4 lo, f16vec4 hi) {
    uint i = tid + j * WG;
    if (i < BN * (BK / 8u)) {
        uint o = (i / (BK / 8u)) * SX4 + 2u * (i % (BK / 8u));
        ws[o] = lo;
        ws[o + 1u] = hi;
    }
}

// Shared tiles <- step k0's registers: X as loaded, W decoded now (AHEAD = 0) or already (AHEAD = 1).
void store_tiles(uint k0, uint n0, uint tid) {
    store_x(tid);
    [[unroll]] for (uint j = 0u; j < WL; ++j) {
        if (AHEAD == 0u) {
            vec4 lo, hi;
            decode_chunk(j, k0, n0, tid, lo, hi);
            store_w(j, tid, f16vec4(lo), f16vec4(hi));
        } else {
            store_w(j, tid, wdec[j][0], wdec[j][1]);
        }
    }
}

// Registers wdec <- chunk j of step k0's W tile, decoded as fp16 (AHEAD).
void decode_ahead(uint j, uint k0, uint n0, uint tid) {
    vec4 lo, hi;
    decode_chunk(j, k0, n0, tid, lo, hi);
    wdec[j][0] = f16vec4(lo);
    wdec[j][1] = f16vec4(hi);
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint wm = sg % WM, wn = sg / WM;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    CM(gl_MatrixUseAccumulator, float) acc[TM * TN];
    [[unroll]] for (uint i = 0u; i < TM * TN; ++i) acc[i] = CM(gl_MatrixUseAccumulator, float)(0.0);

    fetch_x(0u, m0, tid);
    fetch_w(0u, n0, tid);
    if (AHEAD != 0u) {
        [[unroll]] for (uint j = 0u; j < WL; ++j) decode_ahead(j, 0u, n0, tid);
        if (BK < pc.K) fetch_w(BK, n0, tid);  // step 1's words: decoded during step 0's products
    }
    store_tiles(0u, n0, tid);
    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        barrier();  // step k0's shared tiles are stored
        bool more = k0 + BK < pc.K;
        if (more) {  // in flight during the products below
            fetch_x(k0 + BK, m0, tid);
            if (AHEAD == 0u) fetch_w(k0 + BK, n0, tid);
        }
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
            // AHEAD: a share of step k0+BK's chunks decoded between this step's products (no branch: past the
            // last step the values decoded are never stored)
            if (AHEAD != 0u)
                [[unroll]] for (uint j = kk / 16u; j < WL; j += BK / 16u) decode_ahead(j, k0 + BK, n0, tid);
        }
        if (AHEAD != 0u && k0 + 2u * BK < pc.K) fetch_w(k0 + 2u * BK, n0, tid);  // decoded in the next step
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
