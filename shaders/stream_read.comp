#version 450
// Streaming read bandwidth probe (workbench.backends.vulkan.bandwidth): the grid reads binding 0's first n4
// 16-byte words once, grid-stride (consecutive threads, consecutive words: the access pattern of a well
// coalesced kernel), UNROLL loads in flight a thread, and adds them as uints (mod 2^32) into one arena word,
// so that the host can check every word was read.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(binding = 0) readonly buffer Words4 { uvec4 w4[]; };
layout(binding = 1) buffer ArenaU { uint actu[]; };

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
const uint UNROLL = 4;

layout(push_constant) uniform PC {
    uint n4, out_off;
} pc;

shared uint part[WG];

void main() {
    uint tid = gl_LocalInvocationID.x, stride = gl_NumWorkGroups.x * WG;
    uint i = gl_WorkGroupID.x * WG + tid;
    uvec4 s = uvec4(0u);
    for (; i + (UNROLL - 1u) * stride < pc.n4; i += UNROLL * stride) {
        uvec4 v[UNROLL];
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) v[u] = w4[i + u * stride];
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) s += v[u];
    }
    for (; i < pc.n4; i += stride) s += w4[i];
    part[tid] = s.x + s.y + s.z + s.w;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) part[tid] += part[tid + h];
        barrier();
    }
    if (tid == 0u) atomicAdd(actu[pc.out_off], part[0]);
}
