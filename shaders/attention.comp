#version 450
// Causal GQA attention of the step's queries over the layer's KV cache (sliding window on local layers),
// with an online softmax over tiles of SK keys. Grid: (n_split, n_kv_heads, T): a workgroup serves one
// query token and the G query heads of one KV head, over one range of keys. With n_split == 1 it covers all
// keys of its query and writes the output; otherwise ("flash decoding") split s covers the s-th run of
// split_len() keys (at least split_keys, growing with the context so that n_split splits hold every key) and
// writes unnormalized partials (acc[hd], max, sum) that attn_combine.comp merges, or, with FUSED_COMBINE, the
// last workgroup of a query to finish (an atomic counter per (token, KV head) in the arena, reset by it) merges.
// Per tile: each subgroup scores keys (its lanes read one key row together, coalesced; dot by subgroupAdd),
// one subgroup per head updates the running max/sum, then each thread accumulates one vec4 column of the
// values over every NKG-th key of the tile (key groups; their sums meet in shared memory after the last tile).
// Cache slots: position p lives in slot p (global layers) or p % ring (sliding layers) of the cache of the
// query's sequence (p_seq: a dispatch may serve several sequences of equal cache shape, one per grid z row).
// KV_F16: the cache holds float16 keys and values (converted on load; scores and sums stay float32).
// QUANT_OUT (with FUSED_COMBINE): the merging workgroup also writes its heads' output as int8 blocks at q8_off
// (q8_block.glsl), the input of the integer matvec that reads it next (as attn_combine.comp's QUANT_OUT).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#if defined(QUANT_OUT) && !defined(FUSED_COMBINE)
#error "QUANT_OUT quantizes the merged output of FUSED_COMBINE"
#endif
#ifdef QUANT_OUT
#define QUANT_ACT
#endif
#include "common.glsl"
#ifdef QUANT_OUT
#include "q8_block.glsl"
#endif
#include "attn_merge.glsl"
layout(binding = 1) coherent buffer ArenaU { uint actu[]; };

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint G = 1;     // query heads per KV head
layout(constant_id = 2) const uint HD = 64;   // head dim
layout(constant_id = 3) const uint SG = 32;   // subgroup size of the device
layout(constant_id = 4) const uint SK = 64;   // keys per tile
layout(constant_id = 5) const bool MULTI_SEQ = true;  // several sequences (caches) in this dispatch
const uint NW = WG / SG;                      // subgroups per workgroup
const uint QV = (HD / 4 + SG - 1) / SG;       // vec4s of a key row per lane
// values: a thread accumulates vec4 column vc of the head's HV, over every NKG-th key of a tile (key group
// kg); the NKG groups' sums meet in shared memory once, after the last tile (fewer, wider loads than a dim
// per thread, and every thread busy where HD < WG)
const uint HV = HD / 4;
const uint NKG = HV < WG ? WG / HV : 1;      // key groups
const uint CPT = (HV + WG - 1) / WG;          // vec4 columns per thread (1 unless HD > 4 * WG)
#define NEG -1.0e30

layout(push_constant) uniform PC {
    uint q_off, q_stride, o_off, o_stride;
    uint n_heads, n_kv, hd, kv_dim;
    uint ring, window, v_off, part_off;
    uint n_split, split_keys;
    float scale;
    uint cnt_off;
    uint t0;  // first token row of this dispatch's sequences; t below is the row within the dispatch
    uint q8_off, q8_stride;  // QUANT_OUT: the int8 blocks (n_heads * hd codes, then a vec4 a block) per token row
} pc;

shared float sc[G * SK];      // scores, then probabilities, of the tile
shared uint slots[SK];
shared float m_run[G], l_run[G], alpha[G];
shared bool last_split;
shared vec4 vsum[NKG > 1 ? WG : 1];  // the key groups' sums of one head

void main() {
    uint tid = gl_LocalInvocationID.x, lane = gl_SubgroupInvocationID, warp = gl_SubgroupID;
    uint s = gl_WorkGroupID.x, kvh = gl_WorkGroupID.y, t = gl_WorkGroupID.z, tg = t + pc.t0;
    uint p = p_pos(tg), cs = KV_SEQ(tg);  // position, and which of binding 4's caches
    uint len = split_len(p, pc.window, pc.split_keys, pc.n_split);
    uint begin = first_key(p, pc.window) + s * len;
    uint end = min(p + 1u, begin + len);
#ifndef FUSED_COMBINE
    // the grid is recorded once and replayed at every position: at a short context a split past the query's
    // last key has nothing to write, since the merge reads only the splits holding keys (splits_used).
    // With FUSED_COMBINE every split must still count itself in.
    if (begin >= end) return;
#endif
    // this lane's slice of the G query vectors (dims 4 * (i * SG + lane) .. + 3)
    vec4 q[G][QV];
    uint qb = (pc.q_off + tg * pc.q_stride + kvh * G * HD) / 4u;
    [[unroll]] for (uint g = 0u; g < G; ++g)
        [[unroll]] for (uint i = 0u; i < QV; ++i) {
            uint c = i * SG + lane;
            q[g][i] = c < HD / 4u ? act4[qb + g * (HD / 4u) + c] * pc.scale : vec4(0.0);
        }
    uint kg = NKG > 1u ? tid / HV : 0u, vc = NKG > 1u ? tid % HV : tid;  // key group, first vec4 column
    bool vlive = kg < NKG;  // threads past NKG * HV (WG not a multiple of HV) take no values
    vec4 acc[G][CPT];
    [[unroll]] for (uint g = 0u; g < G; ++g)
        [[unroll]] for (uint i = 0u; i < CPT; ++i) acc[g][i] = vec4(0.0);
    if (tid < G) {
        m_run[tid] = NEG;
        l_run[tid] = 0.0;
    }
    for (uint k0 = begin; k0 < end; k0 += SK) {
        uint nk = min(SK, end - k0);
        for (uint j = tid; j < SK; j += WG) {
            uint k = k0 + min(j, nk - 1u);  // past the end: repeat a valid key (its probability is 0)
            slots[j] = pc.window > 0u ? k % pc.ring : k;
        }
        barrier();
        // scores: subgroup `warp` takes keys warp, warp + NW, ...
        [[unroll]] for (uint jj = 0u; jj < SK / NW; ++jj) {
            uint j = jj * NW + warp;
            uint kb = (slots[j] * pc.kv_dim + kvh * HD) / 4u;
            float part[G];
            [[unroll]] for (uint g = 0u; g < G; ++g) part[g] = 0.0;
            [[unroll]] for (uint i = 0u; i < QV; ++i) {
                uint c = i * SG + lane;
                vec4 kv_ = c < HD / 4u ? KV_GET4(caches4[cs].v[kb + c]) : vec4(0.0);
                [[unroll]] for (uint g = 0u; g < G; ++g) part[g] += dot(kv_, q[g][i]);
            }
            [[unroll]] for (uint g = 0u; g < G; ++g) {
                float d = subgroupAdd(part[g]);
                if (lane == 0u) sc[g * SK + j] = j < nk ? d : NEG;
            }
        }
        barrier();
        // softmax bookkeeping: subgroup g handles head g
        for (uint g = warp; g < G; g += NW) {
            float mx = NEG;
            for (uint j = lane; j < SK; j += SG) mx = max(mx, sc[g * SK + j]);
            mx = subgroupMax(mx);
            float m_new = max(m_run[g], mx);
            float sm = 0.0;
            for (uint j = lane; j < SK; j += SG) {
                float pr = j < nk ? exp(sc[g * SK + j] - m_new) : 0.0;
                sc[g * SK + j] = pr;
                sm += pr;
            }
            sm = subgroupAdd(sm);
            if (lane == 0u) {
                float a = exp(m_run[g] - m_new);
                alpha[g] = a;
                l_run[g] = l_run[g] * a + sm;
                m_run[g] = m_new;
            }
        }
        barrier();
        [[unroll]] for (uint g = 0u; g < G; ++g)
            [[unroll]] for (uint i = 0u; i < CPT; ++i) acc[g][i] *= alpha[g];
        [[unroll]] for (uint jj = 0u; jj < (SK + NKG - 1u) / NKG; ++jj) {
            uint j = jj * NKG + kg;
            if (vlive && j < SK) {
                uint vb = (pc.v_off + slots[j] * pc.kv_dim + kvh * HD) / 4u;
                [[unroll]] for (uint i = 0u; i < CPT; ++i) {
                    uint c = vc + i * WG;
                    vec4 v = c < HV ? KV_GET4(caches4[cs].v[vb + c]) : vec4(0.0);
                    [[unroll]] for (uint g = 0u; g < G; ++g) acc[g][i] += sc[g * SK + j] * v;
                }
            }
        }
        barrier();
    }
    if (NKG > 1u) {  // the key groups' sums: group 0's threads end with the head's whole vec4 column
        [[unroll]] for (uint g = 0u; g < G; ++g) {
            vsum[tid] = acc[g][0];
            barrier();
            if (kg == 0u)
                for (uint k = 1u; k < NKG; ++k) acc[g][0] += vsum[k * HV + vc];
            barrier();
        }
    }
    bool vout = kg == 0u;  // the threads that hold output columns
    [[unroll]] for (uint g = 0u; g < G; ++g) {
        uint h = kvh * G + g;
        if (pc.n_split == 1u) {
            float inv = l_run[g] > 0.0 ? 1.0 / l_run[g] : 0.0;
            [[unroll]] for (uint i = 0u; i < CPT; ++i) {
                uint c = vc + i * WG, ob = pc.o_off + tg * pc.o_stride + h * HD + 4u * c;
                if (vout && c < HV)
                    [[unroll]] for (uint e = 0u; e < 4u; ++e) act[ob + e] = acc[g][i][e] * inv;
            }
        } else {
            uint base = pc.part_off + ((t * pc.n_split + s) * pc.n_heads + h) * (HD + 2u);
            [[unroll]] for (uint i = 0u; i < CPT; ++i) {
                uint c = vc + i * WG;
                if (vout && c < HV)
                    [[unroll]] for (uint e = 0u; e < 4u; ++e) actc[base + 4u * c + e] = acc[g][i][e];
            }
            if (tid == 0u) {
                actc[base + HD] = m_run[g];
                actc[base + HD + 1u] = l_run[g];
            }
        }
    }
#ifdef FUSED_COMBINE
    if (pc.n_split == 1u) return;
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) {
        uint c = pc.cnt_off + t * pc.n_kv + kvh;
        last_split = atomicAdd(actu[c], 1u) == pc.n_split - 1u;
        if (last_split) actu[c] = 0u;  // ready for the next step
    }
    barrier();
    if (!last_split) return;
    memoryBarrierBuffer();
    uint used = splits_used(p, pc.window, pc.split_keys, pc.n_split);
    for (uint g = 0u; g < G; ++g) {
        uint h = kvh * G + g;
        merge_head(pc.part_off, pc.n_split, pc.n_heads, HD, t, h, used, pc.o_off + tg * pc.o_stride + h * HD, tid, WG);
    }
#ifdef QUANT_OUT
    memoryBarrierBuffer();
    barrier();  // the heads' outputs, written by every thread of the workgroup
    merged_to_q8(pc.o_off + tg * pc.o_stride + kvh * G * HD, (pc.q8_off + tg * pc.q8_stride) / 4u, pc.n_heads * HD,
                 kvh * G * (HD / 32u), G * (HD / 32u), tid, WG);
#endif
#endif
}
