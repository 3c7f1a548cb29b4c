//===- gemv.cc: y (DIM_M fp32) += W (DIM_M x DIM_K bf16) @ x (DIM_K bf16) -===//
//
// Written for workbench (not part of mlir-aie). mlir-aie's mv.cc ships its bf16 combination commented out
// (only matvec_vectorized_i16_i32 links), so the bf16 GEMV designs call this kernel; the i16 GEMVs (the
// calibration designs) keep mv.cc.
//
// W arrives as mv.cc expects it, transposed at 32-bit granularity by the memory tile's DMA pattern
// (schedule.gemv_schedule: W_L2L1 dims ((k/2, 2), (m, k), (2, 1))): element (i, j) sits at
// (j / 2) * 2 * DIM_M + 2 * i + j % 2, i.e. for each pair of columns the DIM_M rows follow each other, each
// row holding its two values of the pair side by side. One 32-lane vector load therefore holds 16 rows x
// 2 columns; multiplied element-wise by the matching pair of x broadcast to 16 lanes, it accumulates in
// fp32 lanes (bf16 products are exact in fp32): lane 2r sums row r's even columns, lane 2r+1 its odd
// columns. After the DIM_K columns, even + odd lanes give each row's dot product, added to y (fp32, zeroed
// by gemv_zero_f32 before the first K block).
// tests/test_npu_kernels_host.py compiles this file on the host against a stand-in for the AIE API and
// checks it against the emulator.
//===----------------------------------------------------------------------===//

#include <aie_api/aie.hpp>
#include <stdint.h>

#ifndef DIM_M
#define DIM_M 64
#endif
#ifndef DIM_K
#define DIM_K 640
#endif

constexpr int kRows = 16;        // rows per block: one 32-lane bf16 vector holds 16 rows x 2 columns
constexpr int kLanes = 2 * kRows;
static_assert(DIM_M % kRows == 0, "DIM_M must be a multiple of 16 (the planner enforces it)");
static_assert(DIM_K % 2 == 0, "DIM_K must be even (32-bit column pairs)");

extern "C" {

void gemv_bf16_f32(bfloat16 *__restrict w, bfloat16 *__restrict x, float *__restrict y) {
  aie::set_rounding(aie::rounding_mode::conv_even);
  const uint32_t *x_pairs = reinterpret_cast<const uint32_t *>(x); // x[2p], x[2p + 1] in one word
  for (int row = 0; row < DIM_M; row += kRows) {
    aie::accum<accfloat, kLanes> acc = aie::zeros<accfloat, kLanes>();
    const bfloat16 *__restrict w_block = w + 2 * row;
    for (int p = 0; p < DIM_K / 2; p++) {
      aie::vector<bfloat16, kLanes> w_pair = aie::load_v<kLanes>(w_block + p * 2 * DIM_M);
      aie::vector<bfloat16, kLanes> x_pair =
          aie::broadcast<uint32_t, kRows>(x_pairs[p]).template cast_to<bfloat16>();
      acc = aie::mac(acc, w_pair, x_pair);
    }
    aie::vector<float, kLanes> lanes = acc.template to_vector<float>();
    aie::accum<accfloat, kRows> out;
    out.from_vector(aie::load_v<kRows>(y + row));
    out = aie::add(out, aie::filter_even(lanes));
    out = aie::add(out, aie::filter_odd(lanes));
    aie::store_v(y + row, out.template to_vector<float>());
  }
}

void gemv_zero_f32(float *__restrict y) {
  for (int row = 0; row < DIM_M; row += kRows)
    aie::store_v(y + row, aie::zeros<float, kRows>());
}

} // extern "C"
