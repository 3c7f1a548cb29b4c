#version 450
// Writes the step's keys and values into the layer's cache: position p goes to slot p (global layers) or
// p % ring (sliding layers), of its sequence's cache (p_seq), as float16 with KV_F16.
// Grid: (ceil(kv_dim / WG), T).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const bool MULTI_SEQ = true;  // several sequences (caches) in this dispatch

layout(push_constant) uniform PC {
    uint k_off, k_stride, v_off_act, v_stride;
    uint kv_dim, ring, window, v_off;
    uint t0;  // first token row of this dispatch's sequences in the step
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y + pc.t0;
    if (i >= pc.kv_dim) return;
    uint p = p_pos(t);
    uint slot = pc.window > 0u ? p % pc.ring : p, s = KV_SEQ(t);
    caches[s].v[slot * pc.kv_dim + i] = KV_PUT(act[pc.k_off + t * pc.k_stride + i]);
    caches[s].v[pc.v_off + slot * pc.kv_dim + i] = KV_PUT(act[pc.v_off_act + t * pc.v_stride + i]);
}
