//===- attention.cc: one KV chunk of single-query (or query-tile) attention -===//
//
// Written for workbench (not part of mlir-aie). Scalar C++ for the AIE core, compiled by aiecc.py with
// Peano; the emulator (workbench/backends/npu/emulator/kernels.py::attention) computes the same steps:
// scores = q . k (bf16 inputs, fp32 accumulation) * scale, an online softmax in fp32 (running max and
// sum), probabilities rounded to bf16 before P @ V, fp32 output accumulator. Not vectorized and not yet
// run on hardware: a correct baseline for the design, to be replaced by an aie::mmul version.
//
// Layout of the state `o` (rows x (D + 2) floats): D unnormalized output values, running max, sum.
//===----------------------------------------------------------------------===//

#include <aie_api/aie.hpp>
#include <math.h>
#include <stdint.h>

#ifndef ROWS
#define ROWS 4 // query rows per work item (query tile x heads per KV head)
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 256
#endif
#ifndef SCALE
#define SCALE 0.0625f
#endif

static inline float bf16_round(float x) { return static_cast<float>(static_cast<bfloat16>(x)); }

extern "C" {

void attn_init_f32(float *o) {
  for (int r = 0; r < ROWS; r++) {
    float *row = o + r * (HEAD_DIM + 2);
    for (int d = 0; d < HEAD_DIM; d++)
      row[d] = 0.0f;
    row[HEAD_DIM] = -3.4e38f; // running max
    row[HEAD_DIM + 1] = 0.0f; // running sum
  }
}

// One chunk of `n` keys (n <= chunk size); masked keys are never sent (the runtime sequence sizes the
// chunk to the visible range).
void attn_chunk_bf16(bfloat16 *q, bfloat16 *k, bfloat16 *v, float *o, int32_t n) {
  float scores[64];
  for (int r = 0; r < ROWS; r++) {
    const bfloat16 *qr = q + r * HEAD_DIM;
    float *row = o + r * (HEAD_DIM + 2);
    float m = row[HEAD_DIM];
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int d = 0; d < HEAD_DIM; d++)
        s += static_cast<float>(qr[d]) * static_cast<float>(k[j * HEAD_DIM + d]);
      scores[j] = s * SCALE;
      m = scores[j] > m ? scores[j] : m;
    }
    float alpha = expf(row[HEAD_DIM] - m);
    float sum = row[HEAD_DIM + 1] * alpha;
    for (int d = 0; d < HEAD_DIM; d++)
      row[d] *= alpha;
    for (int j = 0; j < n; j++) {
      float p = expf(scores[j] - m);
      sum += p;
      float pb = bf16_round(p);
      for (int d = 0; d < HEAD_DIM; d++)
        row[d] += pb * static_cast<float>(v[j * HEAD_DIM + d]);
    }
    row[HEAD_DIM] = m;
    row[HEAD_DIM + 1] = sum;
  }
}

} // extern "C"
