// Small CPU loops shared by the C++ kernels (memory/csrc/memory_step.cpp, knn/csrc/knn_step.cpp):
//   * exp(x) for x <= 0, one element at a time and in eight AVX2 lanes: libm's expf is one call per
//     element, which the compiler does not vectorise without -ffast-math, and softmax-like read-outs
//     spent most of their time there;
//   * the inner products of up to four query rows with keys stored transposed, the rows' products
//     kept in registers across the key dimension (a loop that adds into memory stores every product
//     once per dimension).
//   * loads of float32 or IEEE half floats (a cache kept in float16) into float32 registers, and
//     which vector units the CPU has (AVX2 + FMA + F16C; AVX-512 F/BW/VL), with switches that make
//     the tests reach the narrower loops on a wider CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define RELUFORMER_AVX2 __attribute__((target("avx2,fma,f16c")))
#define RELUFORMER_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#endif

namespace reluformer {

// exp(x) for x <= 0 without a libm call, so that loops of it vectorise:
// x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite's two-part ln2), exp(r) by its degree-6 Taylor
// polynomial (relative error below 2e-7), 2^n written into the exponent bits. Below -87.3 the
// result would be subnormal: 0 (softmax gives those weights 0 to float precision anyway); NaN
// gives NaN. The scalar and vector versions below share these constants and compute the same steps.
constexpr float kExpFloor = -87.3f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kRoundMagic = 12582912.f;  // 1.5 * 2^23: adding and subtracting it rounds to nearest
constexpr float kLn2High = 0.693359375f, kLn2Low = 2.12194440e-4f;  // ln2 = high - low
// Horner's steps of the Taylor polynomial after its leading 1/720
constexpr float kExpTaylor[] = {1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f};

inline float exp_nonpositive(float x) {
  const float clamped = std::max(x, kExpFloor);
  // round to nearest by the magic constant: no call, no rounding-mode dependence
  const float n = (clamped * kLog2e + kRoundMagic) - kRoundMagic;
  const float r = (clamped - n * kLn2High) + n * kLn2Low;
  float p = 1.f / 720.f;
  for (const float c : kExpTaylor) p = p * r + c;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < kExpFloor ? 0.f : p * scale;
}

#if defined(__x86_64__)
RELUFORMER_AVX2 inline __m256 exp_nonpositive8(__m256 x) {  // exp_nonpositive in 8 lanes
  const __m256 floor = _mm256_set1_ps(kExpFloor);
  const __m256 clamped = _mm256_max_ps(x, floor);
  const __m256 magic = _mm256_set1_ps(kRoundMagic);
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(clamped, _mm256_set1_ps(kLog2e)), magic), magic);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), clamped);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(kLn2Low), r);
  __m256 p = _mm256_set1_ps(1.f / 720.f);
  for (const float c : kExpTaylor) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
  // -inf and below the floor: 0; NaN stays NaN, as in the scalar version and torch.exp
  const __m256 kept = _mm256_andnot_ps(_mm256_cmp_ps(x, floor, _CMP_LT_OQ), result);
  return _mm256_blendv_ps(kept, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// RELUFORMER_NO_AVX2=1: the portable loops on any CPU (how the tests reach them on one with AVX2)
inline bool has_avx2() {
  static const bool yes = std::getenv("RELUFORMER_NO_AVX2") == nullptr && __builtin_cpu_supports("avx2") &&
                          __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return yes;
}

// RELUFORMER_NO_AVX512=1: the AVX2 loops on a CPU with AVX-512 (how the tests reach them there)
inline bool has_avx512() {
  static const bool yes = has_avx2() && std::getenv("RELUFORMER_NO_AVX512") == nullptr &&
                          __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

RELUFORMER_AVX512 inline __m512 exp_nonpositive16(__m512 x) {  // exp_nonpositive in 16 lanes
  const __m512 floor = _mm512_set1_ps(kExpFloor);
  const __m512 clamped = _mm512_max_ps(x, floor);
  const __m512 magic = _mm512_set1_ps(kRoundMagic);
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(kLog2e)), magic), magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), clamped);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  for (const float c : kExpTaylor) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  const __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 result = _mm512_mul_ps(p, _mm512_castsi512_ps(exponent));
  // -inf and below the floor: 0; NaN stays NaN, as in the scalar version and torch.exp
  const __m512 kept = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, floor, _CMP_NLT_UQ), result);
  return _mm512_mask_mov_ps(kept, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// Keys and values are float32, or IEEE half floats (their bits as uint16_t) where a cache keeps
// them so (half the bytes a step reads): loaded as float32 in registers either way.
RELUFORMER_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
RELUFORMER_AVX2 inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
RELUFORMER_AVX2 inline float load1(const float* p) { return *p; }
RELUFORMER_AVX2 inline float load1(const uint16_t* p) { return _cvtsh_ss(*p); }
RELUFORMER_AVX512 inline __m512 load16(const float* p, __mmask16 lanes) { return _mm512_maskz_loadu_ps(lanes, p); }
RELUFORMER_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 lanes) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, p));
}

// The lanes of the first ``n`` (< 16 allowed, <= 0 none) floats of a 16-float chunk.
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << n) - 1u);
}

// out[j][m] = start[m] (0 where start is null) + q_j . key_m for Rows query rows and the first
// ``slots`` keys of ``kt`` (dim, key_stride): two chunks of eight slots at a time, so that each
// broadcast query element serves both.
template <int Rows, typename Key = float>
RELUFORMER_AVX2 void row_products_avx2(const float* const* q, const Key* kt, int64_t key_stride, int64_t dim,
                                       int64_t slots, const float* start, float* const* out) {
  int64_t m = 0;
  for (; m + 16 <= slots; m += 16) {
    __m256 low[Rows], high[Rows];
    const __m256 start_low = start != nullptr ? _mm256_loadu_ps(start + m) : _mm256_setzero_ps();
    const __m256 start_high = start != nullptr ? _mm256_loadu_ps(start + m + 8) : _mm256_setzero_ps();
    for (int j = 0; j < Rows; ++j) low[j] = start_low, high[j] = start_high;
    for (int64_t d = 0; d < dim; ++d) {
      const __m256 key_low = load8(kt + d * key_stride + m);
      const __m256 key_high = load8(kt + d * key_stride + m + 8);
      for (int j = 0; j < Rows; ++j) {
        const __m256 a = _mm256_set1_ps(q[j][d]);
        low[j] = _mm256_fmadd_ps(a, key_low, low[j]);
        high[j] = _mm256_fmadd_ps(a, key_high, high[j]);
      }
    }
    for (int j = 0; j < Rows; ++j) {
      _mm256_storeu_ps(out[j] + m, low[j]);
      _mm256_storeu_ps(out[j] + m + 8, high[j]);
    }
  }
  for (; m + 8 <= slots; m += 8) {
    __m256 acc[Rows];
    const __m256 first = start != nullptr ? _mm256_loadu_ps(start + m) : _mm256_setzero_ps();
    for (int j = 0; j < Rows; ++j) acc[j] = first;
    for (int64_t d = 0; d < dim; ++d) {
      const __m256 key = load8(kt + d * key_stride + m);
      for (int j = 0; j < Rows; ++j) acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(q[j][d]), key, acc[j]);
    }
    for (int j = 0; j < Rows; ++j) _mm256_storeu_ps(out[j] + m, acc[j]);
  }
  for (; m < slots; ++m) {
    for (int j = 0; j < Rows; ++j) {
      float sum = start != nullptr ? start[m] : 0.f;
      for (int64_t d = 0; d < dim; ++d) sum += q[j][d] * load1(kt + d * key_stride + m);
      out[j][m] = sum;
    }
  }
}

RELUFORMER_AVX2 inline void exp_nonpositive_avx2(float* x, int64_t n) {
  const int64_t whole = n - n % 8;
  for (int64_t i = 0; i < whole; i += 8) _mm256_storeu_ps(x + i, exp_nonpositive8(_mm256_loadu_ps(x + i)));
  for (int64_t i = whole; i < n; ++i) x[i] = exp_nonpositive(x[i]);
}
#else
inline bool has_avx2() { return false; }
inline bool has_avx512() { return false; }
#endif

// x[i] = exp(x[i]) in place, for x[i] <= 0 (-inf and anything below -87.3 give 0, NaN NaN).
inline void exp_nonpositive_inplace(float* x, int64_t n) {
#if defined(__x86_64__)
  if (has_avx2()) {
    exp_nonpositive_avx2(x, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) x[i] = exp_nonpositive(x[i]);
}

}  // namespace reluformer
