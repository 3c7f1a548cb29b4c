#version 450
// The kernels of Gemma 3n's op kinds (docs/gemma3n.md), one define per kind. Activations are float32 rows
// with strides; AltUp streams are (T, 4 * H): stream i is columns i*H .. (i+1)*H. Small weights (the AltUp
// router, its coefficients, norm weights, small-K matrices) are float32 in `smalls`. Workgroup sums use
// subgroupAdd then shared memory, so any subgroup size works. Grid per define:
//   OP_ALTUP_EXPAND   (4, T)       stream s of y: a (s = 0) or the projection s (b, c, d) rescaled to a's RMS
//   OP_ALTUP_UNEMBED  (1, R)       y = mean(a, b, c, d rescaled to a's RMS)  (a: stream 0 of the gathered rows)
//   OP_ALTUP_SPLIT    (ceil(H/WG), R, 3)  streams 1..3 of a copied to b, c, d (inputs of the unembed projections)
//   OP_ALTUP_PREDICT  (split, T)   router of stream 0, y = predicted streams, z = the active one (p_0);
//                                  INJECT: streams 1..3 of a are read + rmsnorm(b; w4_off) (the previous
//                                  layer's ple_inject and its post-norm)
//   OP_ALTUP_CORRECT  (split, T)   router of z = b, y = corrected streams, z = q_0 * correct_scale
//   OP_LAUREL         (ceil(H/WG), T)  y = ((a + b) + (c + d)) / sqrt(2)
//   OP_LAUREL_NORM    (1, T)       the same with b and d RMS-normalized here (weights w_off, w2_off): the
//                                  post-attention and LAuReL post-norms folded in
//   OP_TOPK           (1, T)       y = relu(a - (mean(a) + scale * std(a)))  (Gaussian top-k of the gate)
//   OP_PLE_PROJECT    (L, T)       y = (rmsnorm(a * scale; w) + b) / sqrt(2) over each layer's `width` values
//   OP_PLE_INJECT     (ceil(4H/WG), T)  y = a with b added to streams 1..3
//   OP_PLE_INJECT_NORM (1, T)      the same with b RMS-normalized here (weight w_off): the post-norm folded in
//   OP_DOWN_T         (ceil(H/2/WG), splits)  a sparse layer's down projection from its transposed float16 copy
//                     (binding 0, F rows of H; DOWN_T_F32: float32): split s sums a[u] * Wt[u] over its `w_off` units u, skipping
//                     those that are zero for every token (c_stride tokens), into partials y[s][t]
//   OP_DOWN_T_REDUCE  (1, T)       y = b + rmsnorm(sum of the `n` splits' partials a; w_off): the post-norm and
//                                  residual add of the down projection
//   OP_MATMUL_SMALL   (ceil(N/WG), T)   y = a @ W.T, W (N, width) float32 in smalls (weights too narrow for matvec)
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;

layout(push_constant) uniform PC {
    uint a_off, a_stride, b_off, b_stride;
    uint c_off, c_stride, d_off, d_stride;
    uint y_off, y_stride, z_off, z_stride;
    uint width, n, w_off, w2_off;
    uint w3_off, w4_off;
    float eps, scale;
} pc;

const float MIN_MS = 1e-5;  // AltUp's floor on a projected stream's mean square
const float INV_SQRT2 = 0.7071067811865476;

shared vec4 red[WG];

// the sum of v over the workgroup (every invocation gets it)
vec4 wg_sum(vec4 v) {
    v = subgroupAdd(v);
    if (subgroupElect()) red[gl_SubgroupID] = v;
    barrier();
    vec4 tot = vec4(0.0);
    for (uint i = 0u; i < gl_NumSubgroups; ++i) tot += red[i];
    barrier();
    return tot;
}

#if defined(OP_ALTUP_PREDICT) || defined(OP_ALTUP_CORRECT)
// the AltUp router's modalities of row x (H values): tanh(R (rmsnorm(x; nw) / H)), R (4, H) at w2_off
vec4 router(uint xb) {
    uint tid = gl_LocalInvocationID.x, H = pc.width;
    float s = 0.0;
    vec4 d = vec4(0.0);
    for (uint h = tid; h < H; h += WG) {
        float v = act[xb + h];
        s += v * v;
        float u = v * smalls[pc.w_off + h];
        d += u * vec4(smalls[pc.w2_off + h], smalls[pc.w2_off + H + h], smalls[pc.w2_off + 2u * H + h],
                      smalls[pc.w2_off + 3u * H + h]);
    }
    vec4 tot = wg_sum(vec4(s, 0.0, 0.0, 0.0));
    vec4 dots = wg_sum(d);
    float inv = 1.0 / sqrt(tot.x / float(H) + pc.eps);
    vec4 m = dots * (inv / float(H));
    return vec4(safe_tanh(m.x), safe_tanh(m.y), safe_tanh(m.z), safe_tanh(m.w));
}
#endif

void main() {
    uint tid = gl_LocalInvocationID.x, g = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
#if defined(OP_ALTUP_EXPAND) || defined(OP_ALTUP_UNEMBED)
    uint H = pc.width;
    uint ab = pc.a_off + t * pc.a_stride;
    uint bb = pc.b_off + t * pc.b_stride, cb = pc.c_off + t * pc.c_stride, db = pc.d_off + t * pc.d_stride;
    vec4 s = vec4(0.0);
    for (uint h = tid; h < H; h += WG) {
        float a = act[ab + h], b = act[bb + h], c = act[cb + h], d = act[db + h];
        s += vec4(a * a, b * b, c * c, d * d);
    }
    vec4 ms = wg_sum(s) / float(H);
    float target = sqrt(ms.x);
    vec4 f = vec4(1.0, target / sqrt(max(ms.y, MIN_MS)), target / sqrt(max(ms.z, MIN_MS)),
                  target / sqrt(max(ms.w, MIN_MS)));
#ifdef OP_ALTUP_EXPAND
    uint src = g == 0u ? ab : g == 1u ? bb : g == 2u ? cb : db;
    float k = f[g];
    uint yb = pc.y_off + t * pc.y_stride + g * H;
    for (uint h = tid; h < H; h += WG) act[yb + h] = act[src + h] * k;
#else
    uint yb = pc.y_off + t * pc.y_stride;
    for (uint h = tid; h < H; h += WG)
        act[yb + h] = (act[ab + h] + act[bb + h] * f.y + act[cb + h] * f.z + act[db + h] * f.w) * 0.25;
#endif
#elif defined(OP_ALTUP_SPLIT)
    uint h = gl_GlobalInvocationID.x, s = gl_WorkGroupID.z;
    if (h >= pc.width) return;
    uint dst = s == 0u ? pc.b_off + t * pc.b_stride : s == 1u ? pc.c_off + t * pc.c_stride : pc.d_off + t * pc.d_stride;
    act[dst + h] = act[pc.a_off + t * pc.a_stride + (s + 1u) * pc.width + h];
#elif defined(OP_ALTUP_PREDICT)
    uint H = pc.width, xb = pc.a_off + t * pc.a_stride;
#ifdef INJECT
    uint rb = pc.b_off + t * pc.b_stride;
    float sr = 0.0;
    for (uint h = tid; h < H; h += WG) sr += act[rb + h] * act[rb + h];
    float inv_r = 1.0 / sqrt(wg_sum(vec4(sr, 0.0, 0.0, 0.0)).x / float(H) + pc.eps);
#endif
    vec4 m = router(xb);  // stream 0 is not injected
    mat4 A;  // A[j][i] = coefficient of stream j in prediction i
    for (uint i = 0u; i < 4u; ++i)
        for (uint j = 0u; j < 4u; ++j) {
            uint r = pc.w3_off + (i * 4u + j) * 4u;
            A[j][i] = dot(m, vec4(smalls[r], smalls[r + 1u], smalls[r + 2u], smalls[r + 3u]));
        }
    uint per = (H + gl_NumWorkGroups.x - 1u) / gl_NumWorkGroups.x;
    uint h1 = min(H, (g + 1u) * per);
    uint yb = pc.y_off + t * pc.y_stride, zb = pc.z_off + t * pc.z_stride;
    for (uint h = g * per + tid; h < h1; h += WG) {
        vec4 x = vec4(act[xb + h], act[xb + H + h], act[xb + 2u * H + h], act[xb + 3u * H + h]);
#ifdef INJECT
        x.yzw += vec3(act[rb + h] * inv_r * smalls[pc.w4_off + h]);
#endif
        vec4 p = x + A * x;
        act[yb + h] = p.x;
        act[yb + H + h] = p.y;
        act[yb + 2u * H + h] = p.z;
        act[yb + 3u * H + h] = p.w;
        act[zb + h] = p.x;
    }
#elif defined(OP_ALTUP_CORRECT)
    uint H = pc.width, pb = pc.a_off + t * pc.a_stride, zin = pc.b_off + t * pc.b_stride;
    vec4 m = router(zin);
    vec4 c;
    for (uint i = 0u; i < 4u; ++i) {
        uint r = pc.w3_off + i * 4u;
        c[i] = dot(m, vec4(smalls[r], smalls[r + 1u], smalls[r + 2u], smalls[r + 3u])) + 1.0;
    }
    uint per = (H + gl_NumWorkGroups.x - 1u) / gl_NumWorkGroups.x;
    uint h1 = min(H, (g + 1u) * per);
    uint yb = pc.y_off + t * pc.y_stride, zb = pc.z_off + t * pc.z_stride;
    for (uint h = g * per + tid; h < h1; h += WG) {
        vec4 p = vec4(act[pb + h], act[pb + H + h], act[pb + 2u * H + h], act[pb + 3u * H + h]);
        vec4 q = p + c * (act[zin + h] - p.x);
        act[yb + h] = q.x;
        act[yb + H + h] = q.y;
        act[yb + 2u * H + h] = q.z;
        act[yb + 3u * H + h] = q.w;
        act[zb + h] = q.x * smalls[pc.w4_off + h];
    }
#elif defined(OP_LAUREL)
    uint h = gl_GlobalInvocationID.x;
    if (h >= pc.width) return;
    float v = (act[pc.a_off + t * pc.a_stride + h] + act[pc.b_off + t * pc.b_stride + h])
            + (act[pc.c_off + t * pc.c_stride + h] + act[pc.d_off + t * pc.d_stride + h]);
    act[pc.y_off + t * pc.y_stride + h] = v * INV_SQRT2;
#elif defined(OP_LAUREL_NORM)
    uint H = pc.width, bb = pc.b_off + t * pc.b_stride, db = pc.d_off + t * pc.d_stride;
    vec4 s = vec4(0.0);
    for (uint h = tid; h < H; h += WG) {
        float b = act[bb + h], d = act[db + h];
        s.xy += vec2(b * b, d * d);
    }
    vec4 ms = wg_sum(s) / float(H);
    float ib = 1.0 / sqrt(ms.x + pc.eps), id = 1.0 / sqrt(ms.y + pc.eps);
    uint ab = pc.a_off + t * pc.a_stride, cb = pc.c_off + t * pc.c_stride, yb = pc.y_off + t * pc.y_stride;
    for (uint h = tid; h < H; h += WG) {
        float att = act[bb + h] * ib * smalls[pc.w_off + h], lau = act[db + h] * id * smalls[pc.w2_off + h];
        act[yb + h] = ((act[ab + h] + att) + (act[cb + h] + lau)) * INV_SQRT2;
    }
#elif defined(OP_PLE_INJECT_NORM)
    uint H = pc.width, bb = pc.b_off + t * pc.b_stride;
    float s = 0.0;
    for (uint h = tid; h < H; h += WG) s += act[bb + h] * act[bb + h];
    float inv = 1.0 / sqrt(wg_sum(vec4(s, 0.0, 0.0, 0.0)).x / float(H) + pc.eps);
    uint ab = pc.a_off + t * pc.a_stride, yb = pc.y_off + t * pc.y_stride;
    for (uint h = tid; h < H; h += WG) {
        float r = act[bb + h] * inv * smalls[pc.w_off + h];
        act[yb + h] = act[ab + h];
        act[yb + H + h] = act[ab + H + h] + r;
        act[yb + 2u * H + h] = act[ab + 2u * H + h] + r;
        act[yb + 3u * H + h] = act[ab + 3u * H + h] + r;
    }
#elif defined(OP_TOPK)
    uint F = pc.width, ab = pc.a_off + t * pc.a_stride, yb = pc.y_off + t * pc.y_stride;
    float s = 0.0;
    for (uint i = tid; i < F; i += WG) s += act[ab + i];
    float mean = wg_sum(vec4(s, 0.0, 0.0, 0.0)).x / float(F);
    float v = 0.0;
    for (uint i = tid; i < F; i += WG) {
        float d = act[ab + i] - mean;
        v += d * d;
    }
    float cut = mean + sqrt(wg_sum(vec4(v, 0.0, 0.0, 0.0)).x / float(F)) * pc.scale;
    for (uint i = tid; i < F; i += WG) act[yb + i] = max(act[ab + i] - cut, 0.0);
#elif defined(OP_PLE_PROJECT)
    uint P = pc.width, ab = pc.a_off + t * pc.a_stride + g * P, bb = pc.b_off + t * pc.b_stride + g * P;
    float s = 0.0;
    for (uint i = tid; i < P; i += WG) {
        float v = act[ab + i] * pc.scale;
        s += v * v;
    }
    float inv = 1.0 / sqrt(wg_sum(vec4(s, 0.0, 0.0, 0.0)).x / float(P) + pc.eps);
    uint yb = pc.y_off + t * pc.y_stride + g * P;
    for (uint i = tid; i < P; i += WG)
        act[yb + i] = (act[ab + i] * pc.scale * inv * smalls[pc.w_off + i] + act[bb + i]) * INV_SQRT2;
#elif defined(OP_PLE_INJECT)
    uint i = gl_GlobalInvocationID.x, H = pc.width;
    if (i >= 4u * H) return;
    float v = act[pc.a_off + t * pc.a_stride + i];
    if (i >= H) v += act[pc.b_off + t * pc.b_stride + i % H];
    act[pc.y_off + t * pc.y_stride + i] = v;
#elif defined(OP_DOWN_T)
    uint H2 = pc.width / 2u, j = gl_GlobalInvocationID.x, s = gl_WorkGroupID.y, T = pc.c_stride;
    uint u0 = s * pc.w_off, u1 = min(pc.n, u0 + pc.w_off);
    vec2 acc[8];
    for (uint t = 0u; t < 8u; ++t) acc[t] = vec2(0.0);
    for (uint u = u0; u < u1; ++u) {
        float f[8];
        bool kept = false;
        for (uint t = 0u; t < T; ++t) {
            f[t] = act[pc.a_off + t * pc.a_stride + u];
            kept = kept || f[t] != 0.0;
        }
        if (!kept || j >= H2) continue;  // a unit the top-k zeroed: its row of the weight is not read
#ifdef DOWN_T_F32
        vec2 w = vec2(uintBitsToFloat(w32[2u * (u * H2 + j)]), uintBitsToFloat(w32[2u * (u * H2 + j) + 1u]));
#else
        vec2 w = unpackHalf2x16(w32[u * H2 + j]);
#endif
        for (uint t = 0u; t < T; ++t) acc[t] += f[t] * w;
    }
    if (j >= H2) return;
    for (uint t = 0u; t < T; ++t) {
        uint yb = pc.y_off + (s * T + t) * pc.width + 2u * j;
        act[yb] = acc[t].x;
        act[yb + 1u] = acc[t].y;
    }
#elif defined(OP_DOWN_T_REDUCE)
    uint H = pc.width, T = pc.c_stride, yb = pc.y_off + t * pc.y_stride, rb = pc.b_off + t * pc.b_stride;
    float ss = 0.0;
    for (uint h = tid; h < H; h += WG) {
        float v = 0.0;
        for (uint s = 0u; s < pc.n; ++s) v += act[pc.a_off + (s * T + t) * H + h];
        act[yb + h] = v;  // read back by this invocation only
        ss += v * v;
    }
    float inv = 1.0 / sqrt(wg_sum(vec4(ss, 0.0, 0.0, 0.0)).x / float(H) + pc.eps);
    for (uint h = tid; h < H; h += WG) act[yb + h] = act[rb + h] + act[yb + h] * inv * smalls[pc.w_off + h];
#elif defined(OP_MATMUL_SMALL)
    uint r = gl_GlobalInvocationID.x, K = pc.width;
    if (r >= pc.n) return;
    uint ab = pc.a_off + t * pc.a_stride, wb = pc.w_off + r * K;
    float s = 0.0;
    for (uint k = 0u; k < K; ++k) s += act[ab + k] * smalls[wb + k];
    act[pc.y_off + t * pc.y_stride + r] = s;
#else
#error "no OP_ defined"
#endif
}
