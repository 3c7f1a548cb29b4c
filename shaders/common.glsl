// Shared declarations of every workbench compute shader.
//
// Bindings (one descriptor set layout for all kernels; unused bindings hold a dummy buffer):
//   0  weights of the op (planar quant blocks, see quant.glsl), read as 32-bit words
//   1  the step's activation arena (float32 tensors at word offsets given in push constants)
//   2  the step's parameters (uint words: tokens, positions, logit rows, written by the host per step)
//   3  small float32 tensors of the model (norm weights, RoPE inverse frequencies)
//   4  the layer's KV caches of up to KV_SEQS sequences (an array of buffers; each: keys then values,
//      float32, or float16 with KV_F16); token row t of the step uses caches[p_seq(t)] (its sequence's index
//      in its dispatch)
//   5  a second weight (the `up` projection of a fused gate/up kernel), like binding 0
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#ifdef KV_F16
#extension GL_EXT_shader_16bit_storage : require
#endif

layout(binding = 0) readonly buffer Weights { uint w32[]; };
layout(binding = 1) buffer Arena { float act[]; };
layout(binding = 1) buffer Arena4 { vec4 act4[]; };
layout(binding = 2) buffer Params { uint params[]; };
layout(binding = 3) readonly buffer Smalls { float smalls[]; };
const uint KV_SEQS = 8;  // = workbench.backends.vulkan.kernels.KV_SEQS
#ifdef KV_F16
// the fp16 cache (kv.fp16): 16-bit storage only, every product stays float32. KV_PUT saturates at the
// largest half (a value past it would store inf, and inf * 0 probabilities would make NaN)
layout(binding = 4) buffer Cache { float16_t v[]; } caches[KV_SEQS];
layout(binding = 4) buffer Cache4 { f16vec4 v[]; } caches4[KV_SEQS];
#define KV_PUT(x) float16_t(clamp((x), -65504.0, 65504.0))
#define KV_GET(x) float(x)
#define KV_GET4(x) vec4(x)
#else
layout(binding = 4) buffer Cache { float v[]; } caches[KV_SEQS];
layout(binding = 4) buffer Cache4 { vec4 v[]; } caches4[KV_SEQS];
#define KV_PUT(x) (x)
#define KV_GET(x) (x)
#define KV_GET4(x) (x)
#endif
layout(binding = 5) readonly buffer Weights2 { uint w32b[]; };
#if defined(Q8_ACT) || defined(QUANT_ACT)
// int8 activations and their block meta (quant_act.comp writes them, the Q8_ACT matvec reads them)
layout(binding = 1) buffer ArenaU4 { uvec4 actu4[]; };
#endif
#ifdef Q8_ACT
// the weights as 16-byte words (for the integer matvec's wide loads)
layout(binding = 0) readonly buffer Weights4 { uvec4 w128[]; };
layout(binding = 5) readonly buffer Weights2x4 { uvec4 w128b[]; };
#endif

// Layout of the params buffer: [0] number of tokens T, [1] number of logit rows R,
// then T token ids from word 4, T positions from word 4 + PARAM_STRIDE, R row indices from 4 + 2*PARAM_STRIDE,
// R sampled token ids (device argmax) from 4 + 3*PARAM_STRIDE, and T cache indices (p_seq) from 4 + 4*PARAM_STRIDE.
const uint PARAM_STRIDE = 8192;  // = workbench.backends.vulkan.program.MAX_STEP_TOKENS
uint p_token(uint t) { return params[4 + t]; }
uint p_pos(uint t) { return params[4 + PARAM_STRIDE + t]; }
uint p_row(uint r) { return params[4 + 2 * PARAM_STRIDE + r]; }
uint p_result(uint r) { return 4 + 3 * PARAM_STRIDE + r; }  // word index of row r's sampled token
uint p_seq(uint t) { return params[4 + 4 * PARAM_STRIDE + t]; }  // which of binding 4's caches row t uses
// kernels that use the caches declare `const bool MULTI_SEQ` (a specialization constant: false when the dispatch
// serves one sequence, which then needs no p_seq read)
#define KV_SEQ(t) (MULTI_SEQ ? p_seq(t) : 0u)

// tanh written so that it saturates cleanly for large |x| (no inf/inf)
float safe_tanh(float x) { return 1.0 - 2.0 / (exp(2.0 * x) + 1.0); }
float gelu_tanh(float x) { return 0.5 * x * (1.0 + safe_tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

// Workgroup index over a 2-D grid (x is capped at 65535 groups).
uint flat_group() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }
