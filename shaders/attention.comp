#version 450
// Causal GQA attention of the step's queries over the layer's KV cache (sliding window on local layers),
// with an online softmax over tiles of WG keys. Grid: (n_split, n_kv_heads, T). With n_split == 1 a
// workgroup covers all keys of its query and writes the output; otherwise ("flash decoding") split s covers
// split_keys keys and writes unnormalized partials (acc[hd], max, sum) that attn_combine.comp merges.
// Cache slots: position p lives in slot p (global layers) or p % ring (sliding layers).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint G = 1;    // query heads per KV head
layout(constant_id = 2) const uint HD = 64;  // head dim
const uint DPT = (HD + WG - 1) / WG;         // output dims per thread
#define MAX_G 8
#define MAX_DPT 8
#define NEG -1.0e30

layout(push_constant) uniform PC {
    uint q_off, q_stride, o_off, o_stride;
    uint n_heads, n_kv, hd, kv_dim;
    uint ring, window, v_off, part_off;
    uint n_split, split_keys;
    float scale;
} pc;

shared float qs[G * HD];
shared float ps[G * WG];
shared uint slots[WG];
shared float red[G * WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint s = gl_WorkGroupID.x, kvh = gl_WorkGroupID.y, t = gl_WorkGroupID.z;
    const uint hd = HD;
    uint p = p_pos(t);
    uint lo = (pc.window > 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
    uint begin = lo + s * pc.split_keys;
    uint end = min(p + 1u, begin + pc.split_keys);
    for (uint i = tid; i < G * hd; i += WG) qs[i] = act[pc.q_off + t * pc.q_stride + kvh * G * hd + i];
    float m_run[MAX_G], l_run[MAX_G], acc[MAX_G][MAX_DPT];
    for (uint g = 0u; g < G; ++g) {
        m_run[g] = NEG;
        l_run[g] = 0.0;
        for (uint i = 0u; i < DPT; ++i) acc[g][i] = 0.0;
    }
    uint nsub = gl_NumSubgroups;
    barrier();
    for (uint k0 = begin; k0 < end; k0 += WG) {
        uint k = k0 + tid;
        float sc[MAX_G];
        for (uint g = 0u; g < G; ++g) sc[g] = NEG;
        if (k < end) {
            uint slot = pc.window > 0u ? k % pc.ring : k;
            slots[tid] = slot;
            uint kb = (slot * pc.kv_dim + kvh * hd) / 4u;
            for (uint g = 0u; g < G; ++g) sc[g] = 0.0;
            for (uint d4 = 0u; d4 < hd / 4u; ++d4) {
                vec4 kv_ = kv4[kb + d4];
                for (uint g = 0u; g < G; ++g) {
                    uint qb = g * hd + 4u * d4;
                    sc[g] += dot(kv_, vec4(qs[qb], qs[qb + 1u], qs[qb + 2u], qs[qb + 3u]));
                }
            }
            for (uint g = 0u; g < G; ++g) sc[g] *= pc.scale;
        }
        // tile max per head
        for (uint g = 0u; g < G; ++g) {
            float mx = subgroupMax(sc[g]);
            if (subgroupElect()) red[g * WG + gl_SubgroupID] = mx;
        }
        barrier();
        float m_new[MAX_G];
        for (uint g = 0u; g < G; ++g) {
            float mx = NEG;
            for (uint i = 0u; i < nsub; ++i) mx = max(mx, red[g * WG + i]);
            m_new[g] = max(m_run[g], mx);
        }
        barrier();
        for (uint g = 0u; g < G; ++g) {
            float pv = k < end ? exp(sc[g] - m_new[g]) : 0.0;
            ps[g * WG + tid] = pv;
            float sm = subgroupAdd(pv);
            if (subgroupElect()) red[g * WG + gl_SubgroupID] = sm;
        }
        barrier();
        for (uint g = 0u; g < G; ++g) {
            float sm = 0.0;
            for (uint i = 0u; i < nsub; ++i) sm += red[g * WG + i];
            float alpha = exp(m_run[g] - m_new[g]);
            l_run[g] = l_run[g] * alpha + sm;
            m_run[g] = m_new[g];
            for (uint i = 0u; i < DPT; ++i) acc[g][i] *= alpha;
        }
        uint nk = min(WG, end - k0);
        for (uint j = 0u; j < nk; ++j) {
            uint vb = pc.v_off + slots[j] * pc.kv_dim + kvh * hd;
            for (uint i = 0u; i < DPT; ++i) {
                uint d = tid + i * WG;
                if (d >= hd) break;
                float v = kv[vb + d];
                for (uint g = 0u; g < G; ++g) acc[g][i] += ps[g * WG + j] * v;
            }
        }
        barrier();
    }
    for (uint g = 0u; g < G; ++g) {
        uint h = kvh * G + g;
        if (pc.n_split == 1u) {
            float inv = l_run[g] > 0.0 ? 1.0 / l_run[g] : 0.0;
            for (uint i = 0u; i < DPT; ++i) {
                uint d = tid + i * WG;
                if (d < hd) act[pc.o_off + t * pc.o_stride + h * hd + d] = acc[g][i] * inv;
            }
        } else {
            uint base = pc.part_off + ((t * pc.n_split + s) * pc.n_heads + h) * (hd + 2u);
            for (uint i = 0u; i < DPT; ++i) {
                uint d = tid + i * WG;
                if (d < hd) act[base + d] = acc[g][i];
            }
            if (tid == 0u) {
                act[base + hd] = m_run[g];
                act[base + hd + 1u] = l_run[g];
            }
        }
    }
}
