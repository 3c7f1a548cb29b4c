#version 450
// Token embedding: y[t] = dequant(E[token_t]) * scale for the tokens whose row lies in this part of the table
// (rows row0 .. row0 + N). Grid: (ceil(K / 8 / WG), T).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define WBUF w32
#define DEQ8 deq_a
#include "quant.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(push_constant) uniform PC {
    uvec4 pl;
    uint K, N, row0, y_off;
    uint y_stride;
    float scale;
} pc;

void main() {
    uint c = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
    uint tok = p_token(t);
    if (c >= pc.K / 8u || tok < pc.row0 || tok >= pc.row0 + pc.N) return;
    vec4 lo, hi;
    deq_a(pc.pl, pc.K, tok - pc.row0, c, lo, hi);
    uint yb = (pc.y_off + t * pc.y_stride) / 4u + 2u * c;
    act4[yb] = lo * pc.scale;
    act4[yb + 1u] = hi * pc.scale;
}
