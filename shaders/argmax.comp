#version 450
// Greedy sampling on the device, in two passes over each logits row r (grid y).
// PASS 1 (grid: n_blocks x rows): each workgroup finds the max of its `block` logits -> partials (value, index).
// PASS 2 (one workgroup per row): the max over the partials -> the row's token id in the params buffer
// (p_result(r), what the host reads back).
// Ties go to the lowest index, as numpy's argmax.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

layout(push_constant) uniform PC {
    uint x_off, n, block, part_off;
    uint n_parts;
} pc;

shared float sv[WG];
shared uint si[WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    float best = -3.0e38;
    uint bi = 0xFFFFFFFFu;
#ifdef PASS1
    uint b0 = gl_WorkGroupID.x * pc.block;
    uint b1 = min(pc.n, b0 + pc.block);
    uint xb = pc.x_off + gl_WorkGroupID.y * pc.n;
    for (uint i = b0 + tid; i < b1; i += WG) {
        float v = act[xb + i];
        if (v > best) { best = v; bi = i; }
    }
#else
    uint pb = pc.part_off + 2u * pc.n_parts * gl_WorkGroupID.y;
    for (uint i = tid; i < pc.n_parts; i += WG) {
        float v = act[pb + 2u * i];
        uint j = floatBitsToUint(act[pb + 2u * i + 1u]);
        if (v > best || (v == best && j < bi)) { best = v; bi = j; }
    }
#endif
    sv[tid] = best;
    si[tid] = bi;
    barrier();
    for (uint w = WG / 2u; w > 0u; w >>= 1) {
        if (tid < w) {
            float v = sv[tid + w];
            uint j = si[tid + w];
            if (v > sv[tid] || (v == sv[tid] && j < si[tid])) { sv[tid] = v; si[tid] = j; }
        }
        barrier();
    }
    if (tid == 0u) {
#ifdef PASS1
        uint pb = pc.part_off + 2u * (pc.n_parts * gl_WorkGroupID.y + gl_WorkGroupID.x);
        act[pb] = sv[0];
        act[pb + 1u] = uintBitsToFloat(si[0]);
#else
        params[p_result(gl_WorkGroupID.y)] = si[0];
#endif
    }
}
