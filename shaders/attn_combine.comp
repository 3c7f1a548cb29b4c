#version 450
// Merges the split partials of attention.comp: o = sum_s acc_s * e^(m_s - M) / sum_s l_s * e^(m_s - M).
// Grid: (n_heads, T).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(push_constant) uniform PC {
    uint o_off, o_stride, part_off, n_heads;
    uint hd, n_split, window, split_keys;
} pc;

void main() {
    uint tid = gl_LocalInvocationID.x, h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    uint p = p_pos(t);
    uint lo = (pc.window > 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
    uint used = min(pc.n_split, (p + 1u - lo + pc.split_keys - 1u) / pc.split_keys);
    uint stride = pc.hd + 2u;
    uint base = pc.part_off + (t * pc.n_split * pc.n_heads + h) * stride;
    float M = -1.0e30;
    for (uint s = 0u; s < used; ++s) M = max(M, act[base + s * pc.n_heads * stride + pc.hd]);
    float L = 0.0;
    for (uint s = 0u; s < used; ++s) {
        uint b = base + s * pc.n_heads * stride;
        L += act[b + pc.hd + 1u] * exp(act[b + pc.hd] - M);
    }
    for (uint d = tid; d < pc.hd; d += WG) {
        float o = 0.0;
        for (uint s = 0u; s < used; ++s) {
            uint b = base + s * pc.n_heads * stride;
            o += act[b + d] * exp(act[b + pc.hd] - M);
        }
        act[pc.o_off + t * pc.o_stride + h * pc.hd + d] = o / L;
    }
}
