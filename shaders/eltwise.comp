#version 450
// Elementwise ops over `rows` x `width` values with row strides. One define picks the op:
// OP_ADD (y = a + b), OP_GELU_MUL (y = gelu_tanh(a) * b), OP_SOFTCAP (y = tanh(a / cap) * cap),
// OP_GATHER (y[r] = a[logit_rows[r]]: the rows that get logits), OP_TO_F16 (y = a as fp16, two values a
// word; width counts pairs: the cooperative-matrix GEMM's input). Grid: (ceil(width / WG), rows).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#ifdef OP_TO_F16
layout(binding = 1) buffer ArenaU { uint actu[]; };
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;

layout(push_constant) uniform PC {
    uint a_off, a_stride, b_off, b_stride;
    uint y_off, y_stride, width, rows;
    float cap;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x, r = gl_WorkGroupID.y;
    if (i >= pc.width) return;
#if defined(OP_TO_F16)
    // value pair i of row r as two halves in one word (row stride y_stride words), clamped to the fp16 range
    vec2 v = vec2(act[pc.a_off + r * pc.a_stride + 2u * i], act[pc.a_off + r * pc.a_stride + 2u * i + 1u]);
    actu[pc.y_off + r * pc.y_stride + i] = packHalf2x16(clamp(v, -65504.0, 65504.0));
#elif defined(OP_GATHER)
    act[pc.y_off + r * pc.y_stride + i] = act[pc.a_off + p_row(r) * pc.a_stride + i];
#else
    float a = act[pc.a_off + r * pc.a_stride + i];
#if defined(OP_ADD)
    float y = a + act[pc.b_off + r * pc.b_stride + i];
#elif defined(OP_GELU_MUL)
    float y = gelu_tanh(a) * act[pc.b_off + r * pc.b_stride + i];
#elif defined(OP_SOFTCAP)
    float y = safe_tanh(a / pc.cap) * pc.cap;
#else
#error "no OP_ defined"
#endif
    act[pc.y_off + r * pc.y_stride + i] = y;
#endif
}
