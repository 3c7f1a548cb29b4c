// Host stand-in for the subset of AMD's AIE API (aie_api/aie.hpp) that mlir/kernels/*.cc use, so tests
// can compile those kernels with the host C++ compiler and run them (tests/test_npu_kernels_host.py).
// Scalar loops with the documented semantics: bf16 rounding to nearest even (the kernels select
// rounding_mode::conv_even), accfloat lanes are fp32, element-wise mul/mac per lane, reduce_add as a
// halving tree (the emulator models it the same way; the hardware's order is not documented). This checks
// the kernels' indexing, loops and masking against the emulator; it says nothing about the real API's
// code generation, timing or exotic rounding.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  bfloat16(float f) { // round to nearest even, as the kernels select
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = static_cast<uint16_t>(u >> 16);
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct accfloat {};

namespace aie {

enum class rounding_mode { floor, conv_even };
inline void set_rounding(rounding_mode) {}

template <typename T, unsigned N> struct vector {
  T v[N];
  T &operator[](unsigned i) { return v[i]; }
  const T &operator[](unsigned i) const { return v[i]; }
  template <typename U> vector<U, N * sizeof(T) / sizeof(U)> cast_to() const {
    vector<U, N * sizeof(T) / sizeof(U)> out;
    std::memcpy(out.v, v, sizeof(v));
    return out;
  }
};

template <typename Tag, unsigned N> struct accum {
  static_assert(std::is_same_v<Tag, accfloat>, "the stand-in has fp32 accumulators only");
  float v[N];
  void from_vector(const vector<float, N> &x) {
    for (unsigned i = 0; i < N; i++)
      v[i] = x[i];
  }
  template <typename T> vector<T, N> to_vector() const {
    vector<T, N> out;
    for (unsigned i = 0; i < N; i++)
      out[i] = T(v[i]);
    return out;
  }
};

template <unsigned N, typename T> vector<std::remove_const_t<T>, N> load_v(T *p) {
  vector<std::remove_const_t<T>, N> out;
  for (unsigned i = 0; i < N; i++)
    out[i] = p[i];
  return out;
}

template <typename T, unsigned N> T *store_v(T *p, const vector<T, N> &x) {
  for (unsigned i = 0; i < N; i++)
    p[i] = x[i];
  return p + N;
}

template <typename T, unsigned N> auto zeros() {
  if constexpr (std::is_same_v<T, accfloat>) {
    accum<accfloat, N> out;
    for (unsigned i = 0; i < N; i++)
      out.v[i] = 0.0f;
    return out;
  } else {
    vector<T, N> out;
    for (unsigned i = 0; i < N; i++)
      out[i] = T(0.0f);
    return out;
  }
}

template <typename T, unsigned N> vector<T, N> broadcast(T x) {
  vector<T, N> out;
  for (unsigned i = 0; i < N; i++)
    out[i] = x;
  return out;
}

template <typename T, unsigned N>
accum<accfloat, N> mac(accum<accfloat, N> acc, const vector<T, N> &a, const vector<T, N> &b) {
  for (unsigned i = 0; i < N; i++)
    acc.v[i] = acc.v[i] + static_cast<float>(a[i]) * static_cast<float>(b[i]);
  return acc;
}

template <typename T, unsigned N> accum<accfloat, N> mac(accum<accfloat, N> acc, const vector<T, N> &a, T b) {
  for (unsigned i = 0; i < N; i++)
    acc.v[i] = acc.v[i] + static_cast<float>(a[i]) * static_cast<float>(b);
  return acc;
}

template <typename T, unsigned N> accum<accfloat, N> mul(const vector<T, N> &a, const vector<T, N> &b) {
  return mac(zeros<accfloat, N>(), a, b);
}

template <typename T, unsigned N> accum<accfloat, N> mul(const vector<T, N> &a, T b) {
  return mac(zeros<accfloat, N>(), a, b);
}

template <unsigned N> accum<accfloat, N> add(accum<accfloat, N> acc, const vector<float, N> &x) {
  for (unsigned i = 0; i < N; i++)
    acc.v[i] = acc.v[i] + x[i];
  return acc;
}

template <typename T, unsigned N> vector<T, N / 2> filter_even(const vector<T, N> &x) {
  vector<T, N / 2> out;
  for (unsigned i = 0; i < N / 2; i++)
    out[i] = x[2 * i];
  return out;
}

template <typename T, unsigned N> vector<T, N / 2> filter_odd(const vector<T, N> &x) {
  vector<T, N / 2> out;
  for (unsigned i = 0; i < N / 2; i++)
    out[i] = x[2 * i + 1];
  return out;
}

template <unsigned N> float reduce_add(vector<float, N> x) {
  for (unsigned half = N / 2; half >= 1; half /= 2)
    for (unsigned i = 0; i < half; i++)
      x[i] = x[i] + x[i + half];
  return x[0];
}

inline float invsqrt(float x) { return 1.0f / std::sqrt(x); }

} // namespace aie
