#version 450
// Decode projection: y[t, row0 + r] = sum_k W[r, k] * x[t, k] for a few tokens t (T <= MAX_T), reading the
// weight in its quantized planar layout once for all tokens.
// Variants: NORM (RMSNorm of x fused in: x * inv_rms(x) * nw), GELU_PAIR (second weight `up` in binding 5:
// y = gelu(W x) * (U x)). ROW_THREADS threads share a row (a power of two; below the subgroup size their sum
// is a shuffle butterfly, above it subgroupAdd then shared memory); each group of ROW_THREADS threads computes
// RB rows (RB > 1 for steps of several tokens: each token's activations of a chunk, loaded and normalized once,
// serve RB rows, so that loads no longer outnumber the FMAs); WG / ROW_THREADS * RB rows per workgroup. Per
// chunk the RB rows' weights are decoded first, then the tokens are taken one at a time (faster than loading
// every token's activations first, which keeps 16 x T floats live: docs/backend-vulkan.md#batched-decode).
// POST_NORM_ADD: the last workgroup to finish (an atomic counter in the arena, reset by it) also computes
// out = r + rmsnorm(y) * pw over the whole output row (the post-norm residual add of Gemma 3), so that
// it needs no dispatch of its own, and the mean squares of out's rows (at ms_out_off). MS_IN (with NORM):
// x's mean squares are read from ms_off (written so by the op that produced x) instead of every workgroup
// summing x's squares (docs/backend-vulkan.md#batched-decode).
// Gemma 3n's sparse layers (docs/backend-vulkan.md#gemma-3n): SPARSE_UP (the up projection after the Gaussian
// top-k): y = gelu(g) * (W x) with g the top-k gate at r_off/r_stride; a group of rows whose gate is zero for
// every token loads none of its weights (gelu(0) = 0). GATE_MUL (the PLE gate): y = gelu(W x) * m with m at
// r_off/r_stride (the layer's per-layer inputs). SKIP_ZERO (the down projection): an 8-column chunk of x
// that is zero for every token loads none of its weights.
// QUANT_ROWS (one token, Q8_ACT): the workgroup's rows, a multiple of 32 consecutive ones (the builder checks),
// are also written as int8 blocks at q_out_off (q8_block.glsl), the input of the integer matvec that reads y
// next, which then needs no quant_act dispatch and barrier of its own (docs/backend-vulkan.md#batched-decode).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_shuffle : require
#ifdef F16_MATH
// fp16 arithmetic variant (devices with shaderFloat16): the products of a chunk in fp16, sums across chunks in
// fp32; activations clamped to the fp16 range
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
float dot8(vec4 a, vec4 b, vec4 c, vec4 d) {
    f16vec4 p = f16vec4(a) * f16vec4(clamp(b, -65504.0, 65504.0)) + f16vec4(c) * f16vec4(clamp(d, -65504.0, 65504.0));
    return float(p.x) + float(p.y) + float(p.z) + float(p.w);
}
#else
float dot8(vec4 a, vec4 b, vec4 c, vec4 d) { return dot(a, b) + dot(c, d); }
#endif
#include "common.glsl"
#if defined(NORM) && !defined(F16_MATH)
// the norm weight multiplies the weights (once per row and chunk) and inv_rms the row sums (once per token),
// instead of both multiplying every token's activations (fp16 products keep normalized activations)
#define FOLD_NORM
#endif
#ifdef POST_NORM_ADD
layout(binding = 1) coherent buffer ArenaC { float actc[]; };
layout(binding = 1) coherent buffer ArenaU { uint actu[]; };
layout(binding = 1) coherent buffer ArenaC4 { vec4 actc4[]; };
#define Y_STORE actc
#else
#define Y_STORE act
#endif
#define WBUF w32
#define DEQ8 deq_a
#include "quant.glsl"
#ifdef GELU_PAIR
#undef WBUF
#undef DEQ8
#define WBUF w32b
#define DEQ8 deq_b
#include "quant.glsl"
#endif
#if (defined(SPARSE_UP) || defined(GATE_MUL)) && defined(POST_NORM_ADD)
#error "SPARSE_UP and GATE_MUL read at r_off, which POST_NORM_ADD uses"
#endif
#if defined(QUANT_ROWS) && (!defined(Q8_ACT) || defined(POST_NORM_ADD))
#error "QUANT_ROWS quantizes the rows of a one-token integer matvec without a post-norm tail"
#endif
#if defined(SKIP_ZERO) && defined(Q8_ACT)
#error "SKIP_ZERO tests float chunks of x"
#endif
#ifdef Q8_ACT
// int8 activations (quant_act.comp: the input norm, if any, is applied there) and integer dot products
#include "q8_block.glsl"
#if defined(NORM) || defined(F16_MATH)
#error "Q8_ACT excludes NORM and F16_MATH"
#endif
#undef WBUF
#define WBUF w32
#define WBUF4 w128
#define UNITW_LOAD unitw_a
#include "quant_q8.glsl"
#ifdef GELU_PAIR
#undef WBUF
#undef WBUF4
#undef UNITW_LOAD
#define WBUF w32b
#define WBUF4 w128b
#define UNITW_LOAD unitw_b
#include "quant_q8.glsl"
#endif
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint ROW_THREADS = 32;
layout(constant_id = 2) const uint NT = 1;  // tokens of the step (at most 8)
layout(constant_id = 3) const uint KC = 8;  // columns of the weight (a constant, so the row loop unrolls)
layout(constant_id = 4) const uint RB = 1;  // rows per group of ROW_THREADS threads
// Q8_ACT: units whose weights a thread loads before it uses any of them (1 or 2: more bytes in flight)
layout(constant_id = 5) const uint UNITS_AHEAD = 1;
#define MAX_T 8
const uint ROWS = WG / ROW_THREADS;  // row groups per workgroup

layout(push_constant) uniform PC {
    uvec4 pl;
    uvec4 pl2;
    uint K, N, unused_t, row0;
    uint x_off, x_stride, y_off, y_stride;
    uint nw_off;
    float eps;
    uint r_off, r_stride, o_off, o_stride;
    uint pw_off;
    float peps;
    uint cnt_off;
    uint ms_off;      // MS_IN: the mean squares of x's rows (written by the post-norm tail that produced x)
    uint ms_out_off;  // POST_NORM_ADD: where the tail writes the mean squares of out's rows
    uint q_out_off;   // QUANT_OUT: out RMS-normalized by the next op's norm, as int8 blocks (q8_block.glsl)
    uint qnw_off;     // QUANT_OUT: that norm's weight (smalls)
    float qeps;
} pc;

shared float red[WG];
shared float inv_rms[MAX_T];
#ifdef QUANT_ROWS
shared float qrows[ROWS * RB];  // the workgroup's outputs, for their int8 blocks
#endif
shared bool last_wg;

#ifdef TAIL_REGS
// The one-token post-norm tail with the row in registers (TAIL_V vec4s a thread, loads issued before they
// are used): a loop over the row in one workgroup waits one memory round trip per iteration (about 20 us at
// 5,376 columns on an H100: docs/backend-vulkan.md#post-norm-tail). Rows up to 4 * TAIL_V * WG columns.
const uint TAIL_A = (2048u + WG - 1u) / WG;
const uint TAIL_V = TAIL_A > 6u ? 6u : TAIL_A;

// Sum of one value per thread over the workgroup (every thread gets it).
float wg_sum(float v) {
    v = subgroupAdd(v);
    barrier();  // `red` is free (an earlier sum may still be reading it)
    if (subgroupElect()) red[gl_SubgroupID] = v;
    barrier();
    float tot = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) tot += red[i];
    return tot;
}

bool tail_fits() {
    return NT == 1u && pc.N % 32u == 0u && pc.N / 4u <= TAIL_V * WG && gl_SubgroupSize >= 8u && WG % 8u == 0u &&
           (pc.y_off | pc.r_off | pc.o_off) % 4u == 0u;
}

// out = r + rmsnorm(y) * pw for one token (y from every workgroup, coherent), its mean squares, and with
// QUANT_OUT the next projection's int8 blocks: the 8 consecutive threads that hold a 32-value block find its
// maximum and sums by shuffles, each packing its own 4 values (the same values as store_q8_block).
void tail_in_registers(uint tid) {
    uint n4 = pc.N / 4u;
    vec4 v[TAIL_V];
    float ss = 0.0;
    [[unroll]] for (uint j = 0u; j < TAIL_V; ++j) {
        uint i = tid + j * WG;
        v[j] = i < n4 ? actc4[pc.y_off / 4u + i] : vec4(0.0);
        ss += dot(v[j], v[j]);
    }
    float inv = 1.0 / sqrt(wg_sum(ss) / float(pc.N) + pc.peps);
    ss = 0.0;
    [[unroll]] for (uint j = 0u; j < TAIL_V; ++j) {  // every load before the stores below (the bindings alias)
        uint i = tid + j * WG;
        if (i < n4) {
            uint p = pc.pw_off + 4u * i;
            vec4 pw = vec4(smalls[p], smalls[p + 1u], smalls[p + 2u], smalls[p + 3u]);
            v[j] = act4[pc.r_off / 4u + i] + v[j] * inv * pw;
            ss += dot(v[j], v[j]);
        }
    }
    [[unroll]] for (uint j = 0u; j < TAIL_V; ++j) {
        uint i = tid + j * WG;
        if (i < n4) actc4[pc.o_off / 4u + i] = v[j];
    }
    float tot = wg_sum(ss);
    if (tid == 0u) actc[pc.ms_out_off] = tot / float(pc.N);
#ifdef QUANT_OUT
    float it = 1.0 / sqrt(tot / float(pc.N) + pc.qeps);
    uint qb = pc.q_out_off / 4u, mb = qb + pc.N / 16u;  // uvec4 indices of the codes and the block metas
    [[unroll]] for (uint j = 0u; j < TAIL_V; ++j) {
        uint i = tid + j * WG;  // i < n4 is the same for the 8 threads of a block (n4 % 8 == 0)
        vec4 x = vec4(0.0);
        if (i < n4) {
            uint p = pc.qnw_off + 4u * i;
            x = v[j] * it * vec4(smalls[p], smalls[p + 1u], smalls[p + 2u], smalls[p + 3u]);
        }
        float amax = max(max(abs(x.x), abs(x.y)), max(abs(x.z), abs(x.w)));
        amax = max(amax, subgroupShuffleXor(amax, 1u));
        amax = max(amax, subgroupShuffleXor(amax, 2u));
        amax = max(amax, subgroupShuffleXor(amax, 4u));
        float d = amax / 127.0, id = amax > 0.0 ? 127.0 / amax : 0.0;
        ivec4 q = clamp(ivec4(roundEven(x * id)), -127, 127);
        int s = q.x + q.y + q.z + q.w;
        s += subgroupShuffleXor(s, 1u);
        s += subgroupShuffleXor(s, 2u);
        int s_hi = subgroupShuffleXor(s, 4u);  // lane 0 of the block: the sum of values 16..31
        if (i < n4) {
            uint blk = i / 8u, k = i % 8u;
            actu[4u * (qb + 2u * blk) + k] = (uint(q.x) & 0xFFu) | ((uint(q.y) & 0xFFu) << 8) |
                                            ((uint(q.z) & 0xFFu) << 16) | ((uint(q.w) & 0xFFu) << 24);
            if (k == 0u) actc4[mb + blk] = vec4(d, d * float(s), d * float(s_hi), 0.0);
        }
    }
#endif
}
#endif

// Sums over the ROW_THREADS lanes of each row, for every token at once (one barrier pair in all, not per
// token): below the subgroup size a shuffle butterfly, above it subgroupAdd then shared memory.
void row_sums(inout float v[NT], uint r_local) {
    if (ROW_THREADS < gl_SubgroupSize) {
        [[unroll]] for (uint t = 0u; t < NT; ++t)
            for (uint o = ROW_THREADS / 2u; o > 0u; o >>= 1) v[t] += subgroupShuffleXor(v[t], o);
        return;
    }
    [[unroll]] for (uint t = 0u; t < NT; ++t) v[t] = subgroupAdd(v[t]);
    if (ROW_THREADS == gl_SubgroupSize) return;
    uint nsg = WG / gl_SubgroupSize;  // NT * nsg <= WG because NT <= 8 <= the subgroup size
    if (subgroupElect())
        [[unroll]] for (uint t = 0u; t < NT; ++t) red[t * nsg + gl_SubgroupID] = v[t];
    barrier();
    uint per = ROW_THREADS / gl_SubgroupSize;
    [[unroll]] for (uint t = 0u; t < NT; ++t) {
        float tot = 0.0;
        for (uint i = 0u; i < per; ++i) tot += red[t * nsg + r_local * per + i];
        v[t] = tot;
    }
    barrier();
}

// Tokens padded to a power of two (the halving levels of scatter_sums).
uint padded_tokens() { return NT > 4u ? 8u : NT > 2u ? 4u : NT; }

// True when scatter_sums applies: several tokens and at least padded_tokens() lanes of a row in a subgroup.
bool scatter_fits() { return NT > 1u && min(ROW_THREADS, gl_SubgroupSize) >= padded_tokens(); }

// Sums of several tokens' values over `width` threads (group `group` of the workgroup; `lane` < width) by
// recursive halving: at each of the first log2(padded tokens) levels a lane sends half of its tokens' partial
// sums to its partner and keeps the other half, then one value is left per lane and a butterfly finishes
// (8 tokens over 32 lanes: 9 shuffles instead of 8 x 5). Returns the sum of token `tok` (set here), which
// every lane holds for its own `tok`; above the subgroup size the subgroups' sums meet in shared memory
// (lanes below padded_tokens() hold the results there).
float scatter_sums(float v[NT], uint width, uint group, uint lane, out uint tok) {
    float w[8];
    [[unroll]] for (uint t = 0u; t < 8u; ++t) w[t] = 0.0;
    [[unroll]] for (uint t = 0u; t < NT; ++t) w[t] = v[t];
    uint np = padded_tokens(), off = 1u;
    tok = 0u;
    [[unroll]] for (uint level = 0u; level < 3u; ++level) {
        uint h = 4u >> level;
        if (np > h) {
            bool up = (lane & off) != 0u;
            [[unroll]] for (uint i = 0u; i < h; ++i) {
                float send = up ? w[i] : w[i + h], keep = up ? w[i + h] : w[i];
                w[i] = keep + subgroupShuffleXor(send, off);
            }
            tok |= up ? h : 0u;
            off <<= 1;
        }
    }
    for (; off < min(width, gl_SubgroupSize); off <<= 1) w[0] += subgroupShuffleXor(w[0], off);
    if (width <= gl_SubgroupSize) return w[0];
    uint nsg = WG / gl_SubgroupSize, sg_lane = lane % gl_SubgroupSize;
    if (sg_lane < np) red[tok * nsg + gl_SubgroupID] = w[0];
    barrier();
    float tot = 0.0;
    if (lane < np) {
        uint per = width / gl_SubgroupSize;
        for (uint i = 0u; i < per; ++i) tot += red[tok * nsg + group * per + i];
    }
    barrier();
    return tot;
}

// A row's output for token t from its sums (s2: the second weight's, under GELU_PAIR).
float row_output(float s, float s2, uint t) {
#ifdef FOLD_NORM
    s *= inv_rms[t];
    s2 *= inv_rms[t];
#endif
#ifdef GELU_PAIR
    s = gelu_tanh(s) * s2;
#endif
    return s;
}

#ifdef SPARSE_UP
// the top-k gate of row `row` (of this weight part) for token t
float gate_at(uint t, uint row) { return act[pc.r_off + t * pc.r_stride + pc.row0 + min(row, pc.N - 1u)]; }
#endif

// what is stored for a row's output s of token t
float stored(float s, uint t, uint row) {
#ifdef SPARSE_UP
    s = gelu_tanh(gate_at(t, row)) * s;
#endif
#ifdef GATE_MUL
    s = gelu_tanh(s) * act[pc.r_off + t * pc.r_stride + pc.row0 + min(row, pc.N - 1u)];
#endif
    return s;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint r_local = tid / ROW_THREADS, lane = tid % ROW_THREADS;
    uint row_base = flat_group() * ROWS * RB + r_local;  // rows row_base + j * ROWS, j < RB
    bool live = row_base < pc.N;
#ifdef SPARSE_UP
    {  // rows whose gate the top-k zeroed for every token: no weight loads (their output is gelu(0) * 0)
        bool any_kept = false;
        [[unroll]] for (uint j = 0u; j < RB; ++j)
            [[unroll]] for (uint t = 0u; t < NT; ++t) any_kept = any_kept || gate_at(t, row_base + j * ROWS) != 0.0;
        live = live && any_kept;
    }
#endif
#if defined(NORM) && defined(MS_IN)
    // the mean squares of x come from the op that wrote x: no pass over x in every workgroup
    if (tid < NT) inv_rms[tid] = 1.0 / sqrt(act[pc.ms_off + tid] + pc.eps);
    barrier();
#elif defined(NORM)
    {  // inv_rms of every token in one pass
        float ss[NT];
        [[unroll]] for (uint t = 0u; t < NT; ++t) ss[t] = 0.0;
        for (uint k = tid; k < KC; k += WG)
            [[unroll]] for (uint t = 0u; t < NT; ++t) {
                float v = act[pc.x_off + t * pc.x_stride + k];
                ss[t] += v * v;
            }
        uint tok;
        float tot = scatter_sums(ss, WG, 0u, tid, tok);
        if (tid < padded_tokens() && tok < NT) inv_rms[tok] = 1.0 / sqrt(tot / float(KC) + pc.eps);
        barrier();
    }
#endif
    float acc[RB][NT];
#ifdef GELU_PAIR
    float acc2[RB][NT];
#endif
    [[unroll]] for (uint j = 0u; j < RB; ++j)
        [[unroll]] for (uint t = 0u; t < NT; ++t) {
            acc[j][t] = 0.0;
#ifdef GELU_PAIR
            acc2[j][t] = 0.0;
#endif
        }
#ifdef Q8_ACT
    if (live) {
        // x rows: KC int8 values (KC / 16 uvec4), then KC / 32 block metas (vec4)
        const uint NU = KC / UNIT_COLS;
        for (uint u0 = lane; u0 < NU; u0 += ROW_THREADS * UNITS_AHEAD) {
            UnitW wa[UNITS_AHEAD * RB];
#ifdef GELU_PAIR
            UnitW wb[UNITS_AHEAD * RB];
#endif
            [[unroll]] for (uint s = 0u; s < UNITS_AHEAD; ++s) {
                uint u = min(u0 + s * ROW_THREADS, NU - 1u);  // past the last unit: a valid one, never summed
                [[unroll]] for (uint j = 0u; j < RB; ++j) {
                    uint row = min(row_base + j * ROWS, pc.N - 1u);  // rows past N: a valid row, never stored
                    wa[s * RB + j] = unitw_a(pc.pl, KC, row, u);
#ifdef GELU_PAIR
                    wb[s * RB + j] = unitw_b(pc.pl2, KC, row, u);
#endif
                }
            }
            [[unroll]] for (uint s = 0u; s < UNITS_AHEAD; ++s) {
                uint u = u0 + s * ROW_THREADS;
                if (u >= NU) break;
                [[unroll]] for (uint t = 0u; t < NT; ++t) {
                    uint qb = (pc.x_off + t * pc.x_stride) / 4u, mb = qb + KC / 16u;
                    [[unroll]] for (uint j = 0u; j < RB; ++j) {
                        acc[j][t] += unit_dot(wa[s * RB + j], u, qb, mb);
#ifdef GELU_PAIR
                        acc2[j][t] += unit_dot(wb[s * RB + j], u, qb, mb);
#endif
                    }
                }
            }
        }
    }
#else
    if (live) {
        const uint NC = KC / 8u;
        [[unroll]] for (uint c = lane; c < NC; c += ROW_THREADS) {
#ifdef SKIP_ZERO
            bool nz = false;
            [[unroll]] for (uint t = 0u; t < NT; ++t) {
                uint xb = (pc.x_off + t * pc.x_stride) / 4u + 2u * c;
                nz = nz || any(notEqual(act4[xb], vec4(0.0))) || any(notEqual(act4[xb + 1u], vec4(0.0)));
            }
            if (!nz) continue;  // a chunk of zero activations: its weights are not loaded
#endif
            vec4 wl[RB], wh[RB];
#ifdef GELU_PAIR
            vec4 wl2[RB], wh2[RB];
#endif
            [[unroll]] for (uint j = 0u; j < RB; ++j) {
                uint row = min(row_base + j * ROWS, pc.N - 1u);  // rows past N: a valid row, never stored
                deq_a(pc.pl, KC, row, c, wl[j], wh[j]);
#ifdef GELU_PAIR
                deq_b(pc.pl2, KC, row, c, wl2[j], wh2[j]);
#endif
            }
#ifdef NORM
            uint nb = pc.nw_off + 8u * c;
            vec4 nlo = vec4(smalls[nb], smalls[nb + 1], smalls[nb + 2], smalls[nb + 3]);
            vec4 nhi = vec4(smalls[nb + 4], smalls[nb + 5], smalls[nb + 6], smalls[nb + 7]);
#endif
#ifdef FOLD_NORM
            [[unroll]] for (uint j = 0u; j < RB; ++j) {
                wl[j] *= nlo;
                wh[j] *= nhi;
#ifdef GELU_PAIR
                wl2[j] *= nlo;
                wh2[j] *= nhi;
#endif
            }
#endif
            [[unroll]] for (uint t = 0u; t < NT; ++t) {
                uint xb = (pc.x_off + t * pc.x_stride) / 4u + 2u * c;
                vec4 xl = act4[xb], xh = act4[xb + 1u];
#if defined(NORM) && !defined(FOLD_NORM)
                xl = (xl * inv_rms[t]) * nlo;
                xh = (xh * inv_rms[t]) * nhi;
#endif
                [[unroll]] for (uint j = 0u; j < RB; ++j) {
                    acc[j][t] += dot8(wl[j], xl, wh[j], xh);
#ifdef GELU_PAIR
                    acc2[j][t] += dot8(wl2[j], xl, wh2[j], xh);
#endif
                }
            }
        }
    }
#endif
    [[unroll]] for (uint j = 0u; j < RB; ++j) {
        uint row = row_base + j * ROWS;
        if (scatter_fits()) {
            uint tok;
            float s = scatter_sums(acc[j], ROW_THREADS, r_local, lane, tok), s2 = 0.0;
#ifdef GELU_PAIR
            s2 = scatter_sums(acc2[j], ROW_THREADS, r_local, lane, tok);
#endif
            s = row_output(s, s2, tok);
            if (lane < padded_tokens() && tok < NT) s = stored(s, tok, row);
            if (lane < padded_tokens() && tok < NT && row < pc.N) Y_STORE[pc.y_off + tok * pc.y_stride + pc.row0 + row] = s;
            continue;
        }
        row_sums(acc[j], r_local);
#ifdef GELU_PAIR
        row_sums(acc2[j], r_local);
#endif
        for (uint t = 0u; t < NT; ++t) {
            float s2 = 0.0;
#ifdef GELU_PAIR
            s2 = acc2[j][t];
#endif
            float s = row_output(acc[j][t], s2, t);
            if (lane == 0u) s = stored(s, t, row);
            if (lane == 0u && row < pc.N) Y_STORE[pc.y_off + t * pc.y_stride + pc.row0 + row] = s;
#ifdef QUANT_ROWS
            if (lane == 0u) qrows[j * ROWS + r_local] = row < pc.N ? s : 0.0;
#endif
        }
    }
#ifdef QUANT_ROWS
    barrier();
    {
        uint nblk = ROWS * RB / 32u, blk = flat_group() * nblk + tid, qb = pc.q_out_off / 4u;
        if (tid < nblk && 32u * blk < pc.N) {
            float v[32];
            [[unroll]] for (uint i = 0u; i < 32u; ++i) v[i] = qrows[32u * tid + i];
            store_q8_block(v, qb, qb + pc.N / 16u, blk);
        }
    }
#endif
#ifdef POST_NORM_ADD
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) {
        last_wg = atomicAdd(actu[pc.cnt_off], 1u) == gl_NumWorkGroups.x * gl_NumWorkGroups.y - 1u;
        if (last_wg) actu[pc.cnt_off] = 0u;  // ready for the next step
    }
    barrier();
    if (!last_wg) return;
    memoryBarrierBuffer();
#ifdef TAIL_REGS
    if (tail_fits()) {
        tail_in_registers(tid);
        return;
    }
#endif
    float ss[NT];  // the post-norm of every token in one pass
    [[unroll]] for (uint t = 0u; t < NT; ++t) ss[t] = 0.0;
    for (uint i = tid; i < pc.N; i += WG)
        [[unroll]] for (uint t = 0u; t < NT; ++t) {
            float v = actc[pc.y_off + t * pc.y_stride + i];
            ss[t] += v * v;
        }
    uint tok;
    float tot = scatter_sums(ss, WG, 0u, tid, tok);
    if (tid < padded_tokens() && tok < NT) inv_rms[tok] = 1.0 / sqrt(tot / float(pc.N) + pc.peps);
    barrier();
    float inv[NT];
    [[unroll]] for (uint t = 0u; t < NT; ++t) {
        inv[t] = inv_rms[t];
        ss[t] = 0.0;
    }
    // every token's loads before any store: the arena's bindings alias, so a store would otherwise order the
    // next token's loads after it (one memory round trip per token)
    for (uint i = tid; i < pc.N; i += WG) {
        float rv[NT], yv[NT];
        [[unroll]] for (uint t = 0u; t < NT; ++t) {
            rv[t] = act[pc.r_off + t * pc.r_stride + i];
            yv[t] = actc[pc.y_off + t * pc.y_stride + i];
        }
        float pw = smalls[pc.pw_off + i];
        [[unroll]] for (uint t = 0u; t < NT; ++t) {
            float o = rv[t] + yv[t] * inv[t] * pw;
            actc[pc.o_off + t * pc.o_stride + i] = o;
            ss[t] += o * o;
        }
    }
    // the mean squares of out, for the next op's RMSNorm (MS_IN), by the same scatter_sums as above
    tot = scatter_sums(ss, WG, 0u, tid, tok);
    if (tid < padded_tokens() && tok < NT) actc[pc.ms_out_off + tok] = tot / float(pc.N);
#ifdef QUANT_OUT
    // the next projection's input: out * inv_rms(out) * nw as int8 blocks, so that it needs no quant_act
    // dispatch (and no barrier) of its own
    barrier();
    if (tid < padded_tokens() && tok < NT) inv_rms[tok] = 1.0 / sqrt(tot / float(pc.N) + pc.qeps);
    memoryBarrierBuffer();
    barrier();
    uint qs = pc.N / 4u + pc.N / 8u;  // floats per token row of the int8 blocks
    for (uint i = tid; i < NT * (pc.N / 32u); i += WG) {
        uint t = i / (pc.N / 32u), blk = i % (pc.N / 32u);
        float v[32];
        float it = inv_rms[t];
        [[unroll]] for (uint e = 0u; e < 32u; ++e) {
            uint c = 32u * blk + e;
            v[e] = actc[pc.o_off + t * pc.o_stride + c] * it * smalls[pc.qnw_off + c];
        }
        uint qb = (pc.q_out_off + t * qs) / 4u;
        store_q8_block(v, qb, qb + pc.N / 16u, blk);
    }
#endif
#endif
}
