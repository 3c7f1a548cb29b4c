#version 450
// Merges the split partials of attention.comp (see attn_merge.glsl). Grid: (n_heads, T).
// QUANT_OUT: also writes the head's output as int8 blocks (q8_block.glsl) at q_off, the input of the integer
// matvec that reads it next (its quant_act dispatch is spared; hd is a multiple of 32, so blocks lie in a head).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifdef QUANT_OUT
#define QUANT_ACT
#endif
#include "common.glsl"
#ifdef QUANT_OUT
#include "q8_block.glsl"
#endif
#include "attn_merge.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(push_constant) uniform PC {
    uint o_off, o_stride, part_off, n_heads;
    uint hd, n_split, window, split_keys;
    uint t0;  // first token row of this dispatch's sequences in the step (partials are per dispatch)
    uint q_off, q_stride;  // QUANT_OUT: the int8 blocks (n_heads * hd codes, then a vec4 a block) per token row
} pc;

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    uint tg = t + pc.t0;
    uint used = splits_used(p_pos(tg), pc.window, pc.split_keys, pc.n_split);
    uint o_base = pc.o_off + tg * pc.o_stride + h * pc.hd;
    merge_head(pc.part_off, pc.n_split, pc.n_heads, pc.hd, t, h, used, o_base, gl_LocalInvocationID.x, WG);
#ifdef QUANT_OUT
    memoryBarrierBuffer();
    barrier();  // the head's outputs, written by every thread of the workgroup
    merged_to_q8(o_base, (pc.q_off + tg * pc.q_stride) / 4u, pc.n_heads * pc.hd, h * (pc.hd / 32u), pc.hd / 32u,
                 gl_LocalInvocationID.x, WG);
#endif
}
