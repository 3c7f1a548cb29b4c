//===- rmsnorm.cc: RMSNorm of NORM_ROWS rows of NORM_LEN bf16 values ------===//
//
// Written for workbench (not part of mlir-aie). mlir-aie's rms_norm.cc does not multiply by a weight and
// its mul.cc multiplies a fixed 1024 values, so the designs (rows of 640 or 256 values for gemma3-270m,
// 5376 for gemma3-27b) use this kernel instead: the row length, the rows per call and the epsilon are
// compile-time defines that mlir/build.py takes from the schedule and the model config.
//
// Per row, as the emulator computes it (workbench/backends/npu/emulator/kernels.py::rmsnorm):
//   1. sum of squares: 16 fp32 accumulator lanes, lane l adds x[l], x[16 + l], ... in order (bf16 products
//      are exact in fp32), then the 16 lanes are added (aie::reduce_add)
//   2. inv = 1 / sqrt(sum * (1 / NORM_LEN) + NORM_EPS) in fp32 (aie::invsqrt)
//   3. the fp32 inv rides in two bf16 scalars (hi = bf16(inv), lo = bf16(inv - hi)): AIE2 has no fp32
//      vector multiply, so x * hi + x * lo is accumulated in fp32 and rounded once to bf16
//   4. that bf16 value times the bf16 weight, rounded to bf16 (round to nearest even throughout)
// tests/test_npu_kernels_host.py compiles this file on the host against a stand-in for the AIE API and
// checks it against the emulator.
//===----------------------------------------------------------------------===//

#include <aie_api/aie.hpp>
#include <stdint.h>

#ifndef NORM_ROWS
#define NORM_ROWS 1
#endif
#ifndef NORM_LEN
#define NORM_LEN 640
#endif
#ifndef NORM_EPS
#define NORM_EPS 1e-6f
#endif

constexpr int kLanes = 16; // bf16 x bf16 -> fp32 element-wise MAC width of the AIE-ML vector unit
static_assert(NORM_LEN % kLanes == 0, "NORM_LEN must be a multiple of 16 (the planner enforces it)");
static_assert(NORM_ROWS >= 1, "NORM_ROWS must be at least 1");

static inline void rmsnorm_row(const bfloat16 *__restrict x, const bfloat16 *__restrict w,
                               bfloat16 *__restrict y) {
  constexpr float inv_len = 1.0f / NORM_LEN;
  aie::accum<accfloat, kLanes> squares = aie::zeros<accfloat, kLanes>();
  for (int i = 0; i < NORM_LEN; i += kLanes) {
    aie::vector<bfloat16, kLanes> v = aie::load_v<kLanes>(x + i);
    squares = aie::mac(squares, v, v);
  }
  float mean = aie::reduce_add(squares.template to_vector<float>()) * inv_len + NORM_EPS;
  float inv = aie::invsqrt(mean);
  bfloat16 inv_hi = static_cast<bfloat16>(inv);
  bfloat16 inv_lo = static_cast<bfloat16>(inv - static_cast<float>(inv_hi));
  for (int i = 0; i < NORM_LEN; i += kLanes) {
    aie::vector<bfloat16, kLanes> v = aie::load_v<kLanes>(x + i);
    aie::accum<accfloat, kLanes> scaled = aie::mul(v, inv_hi);
    scaled = aie::mac(scaled, v, inv_lo);
    aie::vector<bfloat16, kLanes> normed = scaled.template to_vector<bfloat16>();
    aie::vector<bfloat16, kLanes> weight = aie::load_v<kLanes>(w + i);
    aie::store_v(y + i, aie::mul(normed, weight).template to_vector<bfloat16>());
  }
}

extern "C" {

// x, y: NORM_ROWS x NORM_LEN bf16 (row-major); w: NORM_LEN bf16 (the norm weight, already 1 + w for Gemma)
void rmsnorm_bf16(bfloat16 *x, bfloat16 *w, bfloat16 *y) {
  aie::set_rounding(aie::rounding_mode::conv_even);
  for (int r = 0; r < NORM_ROWS; r++)
    rmsnorm_row(x + r * NORM_LEN, w, y + r * NORM_LEN);
}

} // extern "C"
