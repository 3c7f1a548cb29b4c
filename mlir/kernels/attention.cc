//===- attention.cc: one KV chunk of causal (sliding-window) attention ----===//
//
// Written for workbench (not part of mlir-aie). Scalar C++ for the AIE core, compiled by mlir/build.py
// with Peano; the emulator (workbench/backends/npu/emulator/kernels.py::attention) computes the same steps:
// scores = q . k (bf16 inputs, fp32 accumulation) * SCALE, an online softmax in fp32 (running max and
// sum), probabilities rounded to bf16 before P @ V, fp32 output accumulator. Not vectorized and not yet
// run on hardware: a correct baseline for the design, to be replaced by an aie::mmul version.
//
// Masking: a query at position p sees a key at position k when k <= p and, on sliding-window layers
// (WINDOW > 0), k > p - WINDOW. Positions come with the data as int32 (two bf16 slots each): the query
// tile's ROWS / GROUP positions after its ROWS x HEAD_DIM values (row r is query r / GROUP: the GROUP
// heads that share the KV head follow each other per token), each chunk's CHUNK key positions after its
// CHUNK x HEAD_DIM keys (its CHUNK x HEAD_DIM values after those: one K|V object, one DMA channel). So
// prefill query tiles and keys in any order (ring buffers) are masked alike; padding queries carry -1 and
// padding keys INT32_MAX and see / are seen by nothing.
// tests/test_npu_kernels_host.py compiles this file on the host against a stand-in for the AIE API and
// checks it against the emulator.
//
// Layout of the state `o` (ROWS x (HEAD_DIM + 2) floats): HEAD_DIM unnormalized output values, running
// max, running sum. A row that saw no key yet keeps max -3.4e38 and sum 0.
//===----------------------------------------------------------------------===//

#include <aie_api/aie.hpp>
#include <math.h>
#include <stdint.h>

#ifndef ROWS
#define ROWS 4 // query rows per work item (query tile x GROUP heads per KV head)
#endif
#ifndef GROUP
#define GROUP 4 // query heads per KV head
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 256
#endif
#ifndef CHUNK
#define CHUNK 64 // keys per chunk
#endif
#ifndef WINDOW
#define WINDOW 0 // sliding window (keys k > p - WINDOW); 0: none
#endif
#ifndef SCALE
#define SCALE 0.0625f
#endif

static_assert(ROWS % GROUP == 0, "ROWS must be whole query tokens of GROUP heads");
static_assert(CHUNK >= 1 && CHUNK <= 64, "CHUNK must be 1..64 (the planner's MAX_KV_CHUNK)");

static inline float bf16_round(float x) { return static_cast<float>(static_cast<bfloat16>(x)); }

static inline bool visible(int32_t key_pos, int32_t query_pos) {
  return key_pos <= query_pos && (WINDOW == 0 || key_pos > query_pos - WINDOW);
}

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

// q: ROWS x HEAD_DIM bf16 + ROWS / GROUP int32 positions; kv: one K|V chunk as one object (one DMA
// channel): CHUNK x HEAD_DIM bf16 keys, CHUNK int32 positions, CHUNK x HEAD_DIM bf16 values;
// o: the state above, updated with the visible keys of this chunk
void attn_chunk_bf16(bfloat16 *q, bfloat16 *kv, float *o) {
  const int32_t *q_pos = reinterpret_cast<const int32_t *>(q + ROWS * HEAD_DIM);
  const bfloat16 *k = kv;
  const int32_t *k_pos = reinterpret_cast<const int32_t *>(kv + CHUNK * HEAD_DIM);
  const bfloat16 *v = kv + CHUNK * HEAD_DIM + 2 * CHUNK;
  float scores[CHUNK];
  bool seen[CHUNK];
  for (int r = 0; r < ROWS; r++) {
    const bfloat16 *qr = q + r * HEAD_DIM;
    const int32_t p = q_pos[r / GROUP];
    float *row = o + r * (HEAD_DIM + 2);
    float m = row[HEAD_DIM];
    for (int j = 0; j < CHUNK; j++) {
      seen[j] = visible(k_pos[j], p);
      if (!seen[j])
        continue;
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
    for (int j = 0; j < CHUNK; j++) {
      if (!seen[j])
        continue;
      float e = expf(scores[j] - m);
      sum += e;
      float pb = bf16_round(e);
      for (int d = 0; d < HEAD_DIM; d++)
        row[d] += pb * static_cast<float>(v[j * HEAD_DIM + d]);
    }
    row[HEAD_DIM] = m;
    row[HEAD_DIM + 1] = sum;
  }
}

} // extern "C"
