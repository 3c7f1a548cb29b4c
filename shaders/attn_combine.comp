#version 450
// Merges the split partials of attention.comp (see attn_merge.glsl). Grid: (n_heads, T).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "attn_merge.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(push_constant) uniform PC {
    uint o_off, o_stride, part_off, n_heads;
    uint hd, n_split, window, split_keys;
    uint t0;  // first token row of this dispatch's sequences in the step (partials are per dispatch)
} pc;

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    uint tg = t + pc.t0;
    uint used = splits_used(p_pos(tg), pc.window, pc.split_keys, pc.n_split);
    merge_head(pc.part_off, pc.n_split, pc.n_heads, pc.hd, t, h, used, pc.o_off + tg * pc.o_stride + h * pc.hd,
               gl_LocalInvocationID.x, WG);
}
