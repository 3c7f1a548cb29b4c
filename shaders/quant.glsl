// Decoders of the weight formats, in the planar layout the Vulkan backend uploads
// (workbench/backends/vulkan/weights.py): each GGUF block field is gathered into its own plane, so the
// quantized values of a row are contiguous and 32-bit aligned. `pl` holds the planes' word offsets.
//
// Include with WBUF set to the weight buffer (w32 or w32b) and DEQ8 to the function name; the format is
// chosen by one of FMT_F32, FMT_F16, FMT_BF16, FMT_Q8_0, FMT_Q5_0, FMT_Q4_K, FMT_Q6_K (GGUF blocks) or the
// re-quantized planar formats of workbench/quant/planar.py: FMT_I8 (int8 per output channel: planes q, f32
// scale per row) and FMT_I4 with I4_GROUP=32/64/128 (planes q nibbles in split-halves order per group, f16
// scale per group, and with I4_ASYM a uint8 zero point per group).
// DEQ8(pl, K, row, c, lo, hi) decodes the 8 values at columns 8c..8c+7 of `row` (K columns); defining
// DEQ8_FETCH and DEQ8_DECODE as names adds the decoder split in a load half and a compute half (below).

#ifndef QUANT_HELPERS
#define QUANT_HELPERS
float half_at(uint word, uint which) { return unpackHalf2x16(word)[which]; }
// the 4 unsigned bytes of a word as floats
vec4 bytes4(uint w) { return vec4(uvec4(w, w >> 8, w >> 16, w >> 24) & 0xFFu); }
// bits 0..3 of x to bit 4 of bytes 0..3 (the multiply puts copies of x 7 bits apart: bit k lands on bit 8k)
uint bit4_per_byte(uint x) { return (((x & 0xFu) * 0x204081u) & 0x01010101u) << 4; }
// 6-bit scale and min of sub-block `sub` (0..7) of a Q4_K superblock from its three scale words
// (llama.cpp's get_scale_min_k4 packing)
uvec2 k4_scale_min(uint s0, uint s1, uint s2, uint sub) {
    if (sub < 4u) return uvec2(bitfieldExtract(s0, int(8u * sub), 6), bitfieldExtract(s1, int(8u * sub), 6));
    int j = int(8u * (sub - 4u));
    return uvec2(bitfieldExtract(s2, j, 4) | (bitfieldExtract(s0, j + 6, 2) << 4),
                 bitfieldExtract(s2, j + 4, 4) | (bitfieldExtract(s1, j + 6, 2) << 4));
}
// 8 signed bytes (two words) times a scale
void i8x8(uint w0, uint w1, float d, out vec4 lo, out vec4 hi) {
    int a = int(w0), b = int(w1);
    lo = d * vec4(bitfieldExtract(a, 0, 8), bitfieldExtract(a, 8, 8), bitfieldExtract(a, 16, 8), bitfieldExtract(a, 24, 8));
    hi = d * vec4(bitfieldExtract(b, 0, 8), bitfieldExtract(b, 8, 8), bitfieldExtract(b, 16, 8), bitfieldExtract(b, 24, 8));
}
#endif

#ifndef DEQ_RAW
#define DEQ_RAW 8  // the most weight words one decode reads (FMT_F32)
#endif
#if DEQ_RAW < 8
#error "DEQ_RAW must be at least 8 (FMT_F32 reads 8 words)"
#endif
#define WREAD(i, a) WBUF[a]
void DEQ8(uvec4 pl, uint K, uint row, uint c, out vec4 lo, out vec4 hi) {
#include "deq8_body.glsl"
}
#undef WREAD

#ifdef DEQ8_FETCH
// The same decoder in two halves, for kernels that issue a tile's loads long before they use them (a GEMM
// loads step k+1 while it multiplies step k): DEQ8_FETCH loads the words DEQ8 would read, DEQ8_DECODE
// computes the values from them. DEQ8_DECODE(pl, K, row, c, DEQ8_FETCH(pl, K, row, c)) == DEQ8(pl, K, row, c).
void DEQ8_FETCH(uvec4 pl, uint K, uint row, uint c, out uint raw[DEQ_RAW]) {
    vec4 lo, hi;  // computed and dropped: the compiler keeps only the loads
#define WREAD(i, a) (raw[i] = WBUF[a])
#include "deq8_body.glsl"
#undef WREAD
}
void DEQ8_DECODE(uvec4 pl, uint K, uint row, uint c, uint raw[DEQ_RAW], out vec4 lo, out vec4 hi) {
#define WREAD(i, a) raw[i]
#include "deq8_body.glsl"
#undef WREAD
}
#endif
