#version 450
// Activations to int8 blocks for the integer matvec (matvec.comp with Q8_ACT): per token row t and block of
// 32 columns, d = max|x| / 127 and q = round(x / d), written as K int8 values followed by one vec4 per block
// (d, d * sum(q[0..15]), d * sum(q[16..31]), 0), so that x[k] ~ d * q[k] (the llama.cpp Q8_1 idea).
// NORM: x is first RMS-normalized and multiplied by the norm weight (y = x * inv_rms * nw): the fused norm
// of a projection moves here, and with MS_IN the mean squares come from the op that wrote x.
// Grid: (block groups, T); each thread quantizes one block at a time.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define QUANT_ACT
#include "common.glsl"
#include "q8_block.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;

layout(push_constant) uniform PC {
    uint x_off, x_stride, q_off, q_stride;
    uint K, nw_off;
    float eps;
    uint ms_off;
} pc;

shared float red[WG];
shared float inv_shared;

void main() {
    uint tid = gl_LocalInvocationID.x, t = gl_WorkGroupID.y;
    uint xb = pc.x_off + t * pc.x_stride;
    float inv = 1.0;
#if defined(NORM) && defined(MS_IN)
    inv = 1.0 / sqrt(act[pc.ms_off + t] + pc.eps);
#elif defined(NORM)
    float s = 0.0;
    for (uint i = tid; i < pc.K; i += WG) {
        float v = act[xb + i];
        s += v * v;
    }
    s = subgroupAdd(s);
    if (subgroupElect()) red[gl_SubgroupID] = s;
    barrier();
    if (tid == 0u) {
        float tot = 0.0;
        for (uint i = 0u; i < gl_NumSubgroups; ++i) tot += red[i];
        inv_shared = 1.0 / sqrt(tot / float(pc.K) + pc.eps);
    }
    barrier();
    inv = inv_shared;
#endif
    uint qb = (pc.q_off + t * pc.q_stride) / 4u, mb = qb + pc.K / 16u;
    for (uint blk = gl_WorkGroupID.x * WG + tid; blk < pc.K / 32u; blk += WG * gl_NumWorkGroups.x) {
        float v[32];
        [[unroll]] for (uint i = 0u; i < 8u; ++i) {
            vec4 x = act4[xb / 4u + 8u * blk + i];
#ifdef NORM
            uint n = pc.nw_off + 32u * blk + 4u * i;
            x *= inv * vec4(smalls[n], smalls[n + 1u], smalls[n + 2u], smalls[n + 3u]);
#endif
            v[4u * i] = x.x;
            v[4u * i + 1u] = x.y;
            v[4u * i + 2u] = x.z;
            v[4u * i + 3u] = x.w;
        }
        store_q8_block(v, qb, mb, blk);
    }
}
