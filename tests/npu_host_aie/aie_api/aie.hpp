// Host stand-in for the subset of AMD's AIE API (aie_api/aie.hpp) that mlir/kernels/*.cc use, so tests
// can compile those kernels with the host C++ compiler and run them (tests/test_npu_kernels_host.py).
// Scalar loops with the documented semantics: bf16 rounding to nearest even (the kernels select
// rounding_mode::conv_even), accfloat lanes are fp32, element-wise mul/mac per lane, reduce_add as a
// halving tree (the emulator models it the same way; the hardware's order is not documented); aie::mmul
// with acc32 lanes (32-bit, wrapping) whose to_vector<T>(shift) shift-round-saturates with the tile's
// rounding and saturation modes as set_rounding / set_saturation leave them (defaults floor and none, as
// UG1603 "Rounding and Saturation Modes" documents; floor and conv_even modeled). This checks
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
struct acc32 {};

namespace aie {

enum class rounding_mode { floor, conv_even };
enum class saturation_mode { none, saturate, symmetric };
namespace detail {
inline rounding_mode rounding = rounding_mode::floor;
inline saturation_mode saturation = saturation_mode::none;

// x / 2**shift rounded as the rounding mode says, then saturated (or truncated) to a signed `bits` integer
inline int64_t srs(int64_t x, int shift, int bits) {
  if (shift > 0) {
    const int64_t floor = x >> shift, rem = x - (floor << shift), half = int64_t(1) << (shift - 1);
    const bool up = rounding == rounding_mode::conv_even && (rem > half || (rem == half && (floor & 1)));
    x = floor + up;
  }
  const int64_t hi = (int64_t(1) << (bits - 1)) - 1;
  if (saturation == saturation_mode::none) { // keep the low `bits` bits, sign-extended
    const uint64_t mask = (uint64_t(1) << bits) - 1, u = static_cast<uint64_t>(x) & mask;
    return u > static_cast<uint64_t>(hi) ? static_cast<int64_t>(u) - (int64_t(1) << bits) : int64_t(u);
  }
  const int64_t lo = saturation == saturation_mode::symmetric ? -hi : -hi - 1;
  return x < lo ? lo : x > hi ? hi : x;
}
} // namespace detail

// bf16 conversions here always round to nearest even (the bf16 kernels select conv_even); the mode set
// here drives the integer shift-round-saturate of mmul::to_vector
inline void set_rounding(rounding_mode m) { detail::rounding = m; }
inline void set_saturation(saturation_mode m) { detail::saturation = m; }

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

// A x B on the matrix unit: A r x s, B s x t, C r x t, each row-major; acc32 lanes (32-bit, wrapping)
template <unsigned R, unsigned S, unsigned T, typename TA, typename TB, typename Acc = acc32> struct mmul {
  static_assert(std::is_same_v<Acc, acc32>, "the stand-in's mmul has acc32 accumulators only");
  static constexpr unsigned size_A = R * S, size_B = S * T, size_C = R * T;
  int32_t c[size_C] = {};

  mmul() = default;
  template <typename V> explicit mmul(const vector<V, size_C> &v, int shift = 0) {
    for (unsigned i = 0; i < size_C; i++)
      c[i] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(v[i]) << shift));
  }
  void mac(const vector<TA, size_A> &a, const vector<TB, size_B> &b) {
    for (unsigned i = 0; i < R; i++)
      for (unsigned j = 0; j < T; j++) {
        int64_t sum = c[i * T + j];
        for (unsigned k = 0; k < S; k++)
          sum += static_cast<int64_t>(a[i * S + k]) * static_cast<int64_t>(b[k * T + j]);
        c[i * T + j] = static_cast<int32_t>(static_cast<uint32_t>(sum));
      }
  }
  template <typename T_out> vector<T_out, size_C> to_vector(int shift = 0) const {
    vector<T_out, size_C> out;
    for (unsigned i = 0; i < size_C; i++)
      out[i] = static_cast<T_out>(detail::srs(c[i], shift, 8 * sizeof(T_out)));
    return out;
  }
};

} // namespace aie
