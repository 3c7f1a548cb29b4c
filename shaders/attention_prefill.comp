#version 450
// Causal GQA attention of a prefill step: QT consecutive query tokens of one sequence and the G query heads of
// one KV head per workgroup (grid: (1, n_kv_heads, ceil(T / QT))), so that every key and value row loaded
// serves QT * G query rows instead of G (attention.comp serves one token a workgroup and re-reads its keys
// for every token: at 512 tokens the layer's key and value reads, not its arithmetic, set its time).
// The workgroup walks the keys of its tokens' union in tiles of SK with an online softmax per query row; a
// key outside a row's range (after its position, or before its sliding window) gets probability 0. Each
// subgroup scores keys (its lanes read one key row together, coalesced; one subgroupAdd per query row), one
// subgroup per row updates its running max and sum, then each thread accumulates one vec4 column of the
// values for every row over every NKG-th key of the tile (key groups, summed in shared memory at the end).
// One cache per dispatch (the backend uses attention.comp for steps of several sequences) and no splits.
// Cache slots: position p lives in slot p (global layers) or p % ring (sliding layers); the backend sizes the
// ring so that the step's stores overwrite no key its earliest token still reads.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "attn_merge.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint G = 1;     // query heads per KV head
layout(constant_id = 2) const uint HD = 64;   // head dim
layout(constant_id = 3) const uint SG = 32;   // subgroup size of the device
layout(constant_id = 4) const uint SK = 64;   // keys per tile
layout(constant_id = 5) const uint QT = 8;    // query tokens per workgroup
const uint NW = WG / SG;                      // subgroups per workgroup
const uint QV = (HD / 4 + SG - 1) / SG;       // vec4s of a key row per lane
const uint R = QT * G;                        // query rows: row r = token r / G, head r % G
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
    uint t0;  // first token row of this dispatch's sequence; t below is the row within the dispatch
    uint n_tok;  // token rows of the dispatch
} pc;

shared float sc[R * SK];      // scores, then probabilities, of the tile
shared uint slots[SK];
shared float m_run[R], l_run[R], alpha[R];
shared uint lo_key[QT], hi_key[QT];  // each token's keys: lo_key .. hi_key - 1 (none past the last token)
shared vec4 vsum[NKG > 1 ? WG : 1];  // the key groups' sums of one row

void main() {
    uint tid = gl_LocalInvocationID.x, lane = gl_SubgroupInvocationID, warp = gl_SubgroupID;
    uint kvh = gl_WorkGroupID.y, tb = gl_WorkGroupID.z * QT;  // this workgroup's first token row
    if (tid < QT) {
        bool live = tb + tid < pc.n_tok;
        uint p = live ? p_pos(tb + tid + pc.t0) : 0u;
        lo_key[tid] = live ? first_key(p, pc.window) : 0xFFFFFFFFu;
        hi_key[tid] = live ? p + 1u : 0u;
    }
    if (tid < R) {
        m_run[tid] = NEG;
        l_run[tid] = 0.0;
    }
    barrier();
    uint begin = 0xFFFFFFFFu, end = 0u;  // the union of the tokens' key ranges
    [[unroll]] for (uint i = 0u; i < QT; ++i) {
        begin = min(begin, lo_key[i]);
        end = max(end, hi_key[i]);
    }
    // this lane's slice of the R query vectors (dims 4 * (i * SG + lane) .. + 3); rows past the last token zero
    vec4 q[R][QV];
    [[unroll]] for (uint r = 0u; r < R; ++r) {
        uint tr = tb + r / G;
        uint qb = (pc.q_off + (tr + pc.t0) * pc.q_stride + (kvh * G + r % G) * HD) / 4u;
        [[unroll]] for (uint i = 0u; i < QV; ++i) {
            uint c = i * SG + lane;
            q[r][i] = c < HD / 4u && tr < pc.n_tok ? act4[qb + c] * pc.scale : vec4(0.0);
        }
    }
    uint kg = NKG > 1u ? tid / HV : 0u, vc = NKG > 1u ? tid % HV : tid;  // key group, first vec4 column
    bool vlive = kg < NKG;  // threads past NKG * HV (WG not a multiple of HV) take no values
    vec4 acc[R][CPT];
    [[unroll]] for (uint r = 0u; r < R; ++r)
        [[unroll]] for (uint i = 0u; i < CPT; ++i) acc[r][i] = vec4(0.0);
    for (uint k0 = begin; k0 < end; k0 += SK) {
        uint nk = min(SK, end - k0);
        for (uint j = tid; j < SK; j += WG) {
            uint k = k0 + min(j, nk - 1u);  // past the end: repeat a valid key (its probability is 0)
            slots[j] = pc.window > 0u ? k % pc.ring : k;
        }
        barrier();
        // scores: subgroup `warp` takes keys warp, warp + NW, ...; a key outside a row's range scores NEG
        [[unroll]] for (uint jj = 0u; jj < SK / NW; ++jj) {
            uint j = jj * NW + warp, k = k0 + j;
            uint kb = (slots[j] * pc.kv_dim + kvh * HD) / 4u;
            float part[R];
            [[unroll]] for (uint r = 0u; r < R; ++r) part[r] = 0.0;
            [[unroll]] for (uint i = 0u; i < QV; ++i) {
                uint c = i * SG + lane;
                vec4 kv_ = c < HD / 4u ? KV_GET4(caches4[0].v[kb + c]) : vec4(0.0);
                [[unroll]] for (uint r = 0u; r < R; ++r) part[r] += dot(kv_, q[r][i]);
            }
            [[unroll]] for (uint r = 0u; r < R; ++r) {
                float d = subgroupAdd(part[r]);
                bool in_range = j < nk && k >= lo_key[r / G] && k < hi_key[r / G];
                if (lane == 0u) sc[r * SK + j] = in_range ? d : NEG;
            }
        }
        barrier();
        // softmax bookkeeping: subgroup `warp` takes rows warp, warp + NW, ...; probabilities of keys out of
        // range are 0 whatever the running maximum (a row with no key yet keeps m = NEG, l = 0)
        for (uint r = warp; r < R; r += NW) {
            float mx = NEG;
            for (uint j = lane; j < SK; j += SG) mx = max(mx, sc[r * SK + j]);
            mx = subgroupMax(mx);
            float m_new = max(m_run[r], mx);
            float sm = 0.0;
            for (uint j = lane; j < SK; j += SG) {
                float s = sc[r * SK + j];
                float pr = s > 0.5 * NEG ? exp(s - m_new) : 0.0;
                sc[r * SK + j] = pr;
                sm += pr;
            }
            sm = subgroupAdd(sm);
            if (lane == 0u) {
                float a = exp(m_run[r] - m_new);
                alpha[r] = a;
                l_run[r] = l_run[r] * a + sm;
                m_run[r] = m_new;
            }
        }
        barrier();
        [[unroll]] for (uint r = 0u; r < R; ++r)
            [[unroll]] for (uint i = 0u; i < CPT; ++i) acc[r][i] *= alpha[r];
        [[unroll]] for (uint jj = 0u; jj < (SK + NKG - 1u) / NKG; ++jj) {
            uint j = jj * NKG + kg;
            if (vlive && j < SK) {
                uint vb = (pc.v_off + slots[j] * pc.kv_dim + kvh * HD) / 4u;
                [[unroll]] for (uint i = 0u; i < CPT; ++i) {
                    uint c = vc + i * WG;
                    vec4 v = c < HV ? KV_GET4(caches4[0].v[vb + c]) : vec4(0.0);
                    [[unroll]] for (uint r = 0u; r < R; ++r) acc[r][i] += sc[r * SK + j] * v;
                }
            }
        }
        barrier();
    }
    if (NKG > 1u) {  // the key groups' sums: group 0's threads end with the row's whole vec4 column
        [[unroll]] for (uint r = 0u; r < R; ++r) {
            vsum[tid] = acc[r][0];
            barrier();
            if (kg == 0u)
                for (uint k = 1u; k < NKG; ++k) acc[r][0] += vsum[k * HV + vc];
            barrier();
        }
    }
    if (kg != 0u) return;  // the threads of group 0 hold the output columns
    [[unroll]] for (uint r = 0u; r < R; ++r) {
        uint tr = tb + r / G;
        if (tr >= pc.n_tok) continue;
        float inv = l_run[r] > 0.0 ? 1.0 / l_run[r] : 0.0;
        uint h = kvh * G + r % G;
        [[unroll]] for (uint i = 0u; i < CPT; ++i) {
            uint c = vc + i * WG, ob = pc.o_off + (tr + pc.t0) * pc.o_stride + h * HD + 4u * c;
            if (c < HV)
                [[unroll]] for (uint e = 0u; e < 4u; ++e) act[ob + e] = acc[r][i][e] * inv;
        }
    }
}
