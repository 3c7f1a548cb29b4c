#version 450
// Greedy sampling on the device, in two passes over the logits of row 0.
// PASS 1 (grid: n_blocks): each workgroup finds the max of its `block` logits -> partials (value, index).
// PASS 2 (one workgroup): the max over the partials -> params[3] (the token id the host reads back).
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
    for (uint i = b0 + tid; i < b1; i += WG) {
        float v = act[pc.x_off + i];
        if (v > best) { best = v; bi = i; }
    }
#else
    for (uint i = tid; i < pc.n_parts; i += WG) {
        float v = act[pc.part_off + 2u * i];
        uint j = floatBitsToUint(act[pc.part_off + 2u * i + 1u]);
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
        act[pc.part_off + 2u * gl_WorkGroupID.x] = sv[0];
        act[pc.part_off + 2u * gl_WorkGroupID.x + 1u] = uintBitsToFloat(si[0]);
#else
        params[3] = si[0];
#endif
    }
}
