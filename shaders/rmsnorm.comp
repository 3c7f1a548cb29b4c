#version 450
// RMSNorm over groups of `width` values of each token row: y = x * inv_rms(x) * w (w already 1 + w).
// Grid: (groups per row, T). Variants: ADD (y = r + norm(x) * w, the post-norm residual add),
// ROPE (rotate-half RoPE of each group after the norm, inverse frequencies in smalls at freq_off),
// NO_NORM (with ROPE: RoPE alone), NO_WEIGHT (no weight: Gemma 3n's V norm, rmsnorm_plain), KV_OUT (with ROPE: the rotated keys go straight into the layer's KV cache
// at the token's slot, and the step's values of the same head are copied there too: no separate store;
// KV_F16: a float16 cache), V_NORM (with KV_OUT: the values RMS-normalized per head, without a weight, as they
// are copied: Gemma 3n's V norm).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const bool MULTI_SEQ = true;  // KV_OUT: several sequences (caches) in this dispatch

layout(push_constant) uniform PC {
    uint x_off, x_stride, y_off, y_stride;
    uint r_off, r_stride, width, w_off;
    uint freq_off;
    float eps;
    uint v_src, v_stride, kv_dim, ring;
    uint window, v_off;
} pc;

shared float red[WG];

// cos/sin of a = position * inv_freq, reduced mod 2*pi first (GPU sin/cos lose accuracy on large arguments)
vec2 cos_sin(float a) {
    float k = round(a * 0.15915494309189535);
    float r = fma(-k, 6.28125, a);
    r = fma(-k, 0.0019353071795864769, r);
    return vec2(cos(r), sin(r));
}

void main() {
    uint tid = gl_LocalInvocationID.x, g = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    uint xb = pc.x_off + t * pc.x_stride + g * pc.width;
    uint yb = pc.y_off + t * pc.y_stride + g * pc.width;
    float inv = 1.0;
#ifndef NO_NORM
    float s = 0.0;
    for (uint i = tid; i < pc.width; i += WG) {
        float v = act[xb + i];
        s += v * v;
    }
    s = subgroupAdd(s);
    if (subgroupElect()) red[gl_SubgroupID] = s;
    barrier();
    float tot = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) tot += red[i];
    inv = 1.0 / sqrt(tot / float(pc.width) + pc.eps);
    barrier();
#endif
#ifdef ROPE
    uint half_w = pc.width / 2u;
    float pos = float(p_pos(t));
#ifdef KV_OUT
    uint slot = pc.window > 0u ? p_pos(t) % pc.ring : p_pos(t);
    uint kb = slot * pc.kv_dim + g * pc.width;
    uint vs = pc.v_src + t * pc.v_stride + g * pc.width;
    uint cs_ = KV_SEQ(t);
    float vinv = 1.0;
#ifdef V_NORM
    float sv = 0.0;
    for (uint i = tid; i < pc.width; i += WG) sv += act[vs + i] * act[vs + i];
    sv = subgroupAdd(sv);
    if (subgroupElect()) red[gl_SubgroupID] = sv;
    barrier();
    float vt = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) vt += red[i];
    vinv = 1.0 / sqrt(vt / float(pc.width) + pc.eps);
    barrier();
#endif
    for (uint i = tid; i < pc.width; i += WG) caches[cs_].v[pc.v_off + kb + i] = KV_PUT(act[vs + i] * vinv);
#define STORE(i, x) caches[cs_].v[kb + (i)] = KV_PUT(x)
#else
#define STORE(i, v) act[yb + (i)] = (v)
#endif
    for (uint i = tid; i < half_w; i += WG) {
        float a = act[xb + i] * inv, b = act[xb + i + half_w] * inv;
#ifndef NO_NORM
        a *= smalls[pc.w_off + i];
        b *= smalls[pc.w_off + i + half_w];
#endif
        vec2 cs = cos_sin(pos * smalls[pc.freq_off + i]);
        STORE(i, a * cs.x - b * cs.y);
        STORE(i + half_w, b * cs.x + a * cs.y);
    }
#else
    for (uint i = tid; i < pc.width; i += WG) {
#ifdef NO_WEIGHT
        float v = act[xb + i] * inv;
#else
        float v = act[xb + i] * inv * smalls[pc.w_off + i];
#endif
#ifdef ADD
        v += act[pc.r_off + t * pc.r_stride + g * pc.width + i];
#endif
        act[yb + i] = v;
    }
#endif
}
