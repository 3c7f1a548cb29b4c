//===- mm_i8.cc: int8 GEMM tile, int32 accumulation over all of K, one SRS -===//
//
// Written for workbench (not part of mlir-aie). mlir-aie's mm.cc loads C, accumulates one k-tile and stores
// it back as the output type on every call (i8_i16: to_vector<int16>() with no shift), so an int8 GEMM
// saturated its partial sums to int16 after every k-step. This kernel keeps them in int32 across the design's
// k-steps and shift-round-saturates once, as the emulator (workbench/backends/npu/emulator/kernels.py::
// matmul_i8_acc) and the XRT path's dequantization (hostside.dequantize_i16) assume:
//   C = srs(sum over all K of A (int8) x B (int8) in int32, shift), int16, rounding half to even, saturating.
//
// Per output tile of DIM_M x DIM_N the design's core calls zero_i32(acc), then matmul_i8_i32(a, b, acc) for
// every k-step but the last, then matmul_srs_i8_i16(a, b, acc, c) for the last one. `acc` is a buffer of
// the core's own (an IRON Buffer, DIM_M x DIM_N int32: the schedule counts it as core scratch).
//
// Layouts (blocks of the MAC tile MMUL_R x MMUL_S x MMUL_T, each block row-major, as aie::mmul loads them):
//   a: DIM_M x DIM_K as [DIM_M / R][DIM_K / S][R][S] (the memory tile's A_L2L1 pattern makes it)
//   b: DIM_K x DIM_N as [DIM_N / T][DIM_K / S][S][T] (pretiled on the host, hostside.pack_gemm_weight),
//      followed by the int32 SRS shift of the weight (the same in every tile of one weight)
//   acc, c: DIM_M x DIM_N as [DIM_M / R][DIM_N / T][R][T] (the C_L2L3 pattern makes it row-major)
// The loops expand the MAC tile EXPAND_M x EXPAND_N times (accumulators held across the k loop), the same
// multiples the schedule plans with (schedule.MM_EXPAND).
// tests/test_npu_kernels_host.py compiles this file on the host against a stand-in for the AIE API and
// checks it bit for bit against the emulator on the buffers the host packs. Not yet compiled with Peano.
//===----------------------------------------------------------------------===//

#include <aie_api/aie.hpp>
#include <stdint.h>

#ifndef DIM_M
#define DIM_M 16
#endif
#ifndef DIM_K
#define DIM_K 128
#endif
#ifndef DIM_N
#define DIM_N 32
#endif
#ifndef MMUL_R // the int8 MAC tile: 4 x 8 x 8 on aie2 (npu1), 8 x 8 x 8 on aie2p (npu2)
#define MMUL_R 4
#endif
#ifndef MMUL_S
#define MMUL_S 8
#endif
#ifndef MMUL_T
#define MMUL_T 8
#endif
#ifndef EXPAND_M
#define EXPAND_M 4
#endif
#ifndef EXPAND_N
#define EXPAND_N 2
#endif

using MMUL = aie::mmul<MMUL_R, MMUL_S, MMUL_T, int8_t, int8_t, acc32>;
constexpr unsigned kRowBlocks = DIM_M / MMUL_R;
constexpr unsigned kDepth = DIM_K / MMUL_S;
constexpr unsigned kColBlocks = DIM_N / MMUL_T;
constexpr unsigned kZeroLanes = 16;
static_assert(DIM_M % (EXPAND_M * MMUL_R) == 0, "DIM_M must be a multiple of EXPAND_M x MMUL_R");
static_assert(DIM_N % (EXPAND_N * MMUL_T) == 0, "DIM_N must be a multiple of EXPAND_N x MMUL_T");
static_assert(DIM_K % MMUL_S == 0, "DIM_K must be a multiple of MMUL_S");
static_assert(DIM_M * DIM_N % kZeroLanes == 0, "the accumulator is zeroed 16 lanes at a time");
static_assert(DIM_K * DIM_N % 4 == 0, "the int32 shift behind b must be word aligned");

// acc += a x b over this k-step; then either store acc (int32, exact) or, on the last k-step, write c as
// the int16 shift-round-saturate of the sum by `shift`
template <bool kLast>
static inline void mac_tile(const int8_t *__restrict a, const int8_t *__restrict b, int32_t *__restrict acc,
                            int16_t *__restrict c, int shift) {
  for (unsigned z = 0; z < kRowBlocks; z += EXPAND_M)
    for (unsigned j = 0; j < kColBlocks; j += EXPAND_N) {
      MMUL blocks[EXPAND_M][EXPAND_N];
      for (unsigned i = 0; i < EXPAND_M; i++)
        for (unsigned l = 0; l < EXPAND_N; l++)
          blocks[i][l] = MMUL(aie::load_v<MMUL::size_C>(acc + ((z + i) * kColBlocks + j + l) * MMUL::size_C));
      for (unsigned kk = 0; kk < kDepth; kk++) {
        aie::vector<int8_t, MMUL::size_A> av[EXPAND_M];
        aie::vector<int8_t, MMUL::size_B> bv[EXPAND_N];
        for (unsigned i = 0; i < EXPAND_M; i++)
          av[i] = aie::load_v<MMUL::size_A>(a + ((z + i) * kDepth + kk) * MMUL::size_A);
        for (unsigned l = 0; l < EXPAND_N; l++)
          bv[l] = aie::load_v<MMUL::size_B>(b + ((j + l) * kDepth + kk) * MMUL::size_B);
        for (unsigned i = 0; i < EXPAND_M; i++)
          for (unsigned l = 0; l < EXPAND_N; l++)
            blocks[i][l].mac(av[i], bv[l]);
      }
      for (unsigned i = 0; i < EXPAND_M; i++)
        for (unsigned l = 0; l < EXPAND_N; l++) {
          const unsigned at = ((z + i) * kColBlocks + j + l) * MMUL::size_C;
          if constexpr (kLast)
            aie::store_v(c + at, blocks[i][l].template to_vector<int16_t>(shift));
          else
            aie::store_v(acc + at, blocks[i][l].template to_vector<int32_t>());
        }
    }
}

extern "C" {

void zero_i32(int32_t *__restrict acc) {
  for (unsigned i = 0; i < DIM_M * DIM_N; i += kZeroLanes)
    aie::store_v(acc + i, aie::zeros<int32_t, kZeroLanes>());
}

// every k-step but the last: acc += a x b in int32
void matmul_i8_i32(int8_t *__restrict a, int8_t *__restrict b, int32_t *__restrict acc) {
  mac_tile<false>(a, b, acc, nullptr, 0);
}

// the last k-step: c = srs(acc + a x b, shift), the shift read from behind b's tile
void matmul_srs_i8_i16(int8_t *__restrict a, int8_t *__restrict b, int32_t *__restrict acc,
                       int16_t *__restrict c) {
  const int32_t shift = *reinterpret_cast<const int32_t *>(b + DIM_K * DIM_N); // DIM_K * DIM_N % 4 == 0
  aie::set_rounding(aie::rounding_mode::conv_even); // half to even, as the emulator's srs
  aie::set_saturation(aie::saturation_mode::saturate); // to [-32768, 32767]
  mac_tile<true>(a, b, acc, c, shift);
}

} // extern "C"
