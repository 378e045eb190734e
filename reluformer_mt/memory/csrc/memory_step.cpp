// One memory-attention decoding step on the CPU in two calls instead of a few dozen small tensor
// operations (reluformer_mt/memory/tm_attention.py):
//   * read_step: a softmax memory reader's sublayer x + g * Attn(LN(x), memory) over the keys and
//     values cached once per sentence (its beams are the query rows), with the head-averaged weights
//     that the copy distribution reads;
//   * copy_step: the copy distribution's correction of one step's log-probabilities in place: the
//     share of each distinct copyable memory token in the row's weights, mixed in by log-add-exp,
//     and log(1 - c) added to every other token;
//   * sparse_scores: the retrieval's dense scores of a batch of queries against every memory entry.
// The PyTorch code they replace (MemoryReader._reference_step, _log_copy_step's reference) stays
// the reference and the fallback; tests/test_memory_fused.py compares the two.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "../../attention/csrc/cpu_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using reluformer::exp_nonpositive;
using reluformer::has_avx2;
#if defined(__x86_64__)
using reluformer::exp_nonpositive16;
using reluformer::exp_nonpositive8;
using reluformer::first_lanes;
using reluformer::has_avx512;
using reluformer::load1;
using reluformer::load16;
using reluformer::load8;
#endif

// a key or value as float32 in the portable loops: float32 as it is, a half float (its bits) converted
inline float as_float(float x) { return x; }
inline float as_float(uint16_t bits) { return c10::detail::fp16_ieee_to_fp32_value(bits); }

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kSmallestShare = 1e-30f;  // below: the copy step's share is mixed in log space


// ---- one (sentence, head) group: its beams' scores over the slots, softmax, weighted values ----
// Each row's exponentials e_m = exp(s_m - max) stay unnormalised: the output is sum_m e_m v_m times
// 1 / sum_m e_m (the row's ``inverse``, 0 for a row that reads nothing), which spares a pass over
// the slots. The portable loops run on any CPU; the AVX2/FMA ones (picked at run time where the
// CPU has them) keep up to four beams' scores and outputs in registers, so that each key and value
// is loaded once for all of them, and the row's max and sum in vector lanes (the portable loops'
// per-element dependency chains made the step slower than the PyTorch reference).

// scores[b][m] = bias[m] + q_b . key_m, keys stored transposed (dim, slots).
template <typename Elem>
void scores_portable(const float* q, int64_t q_stride, int64_t beams, const Elem* kt, int64_t key_stride, int64_t dim,
                     int64_t slots, const float* bias, float* scores) {
  for (int64_t b = 0; b < beams; ++b) {
    float* s = scores + b * slots;
    for (int64_t m = 0; m < slots; ++m) s[m] = bias != nullptr ? bias[m] : 0.f;
    const float* qb = q + b * q_stride;
    for (int64_t d = 0; d < dim; ++d) {
      const float a = qb[d];
      const Elem* row = kt + d * key_stride;
      for (int64_t m = 0; m < slots; ++m) s[m] += a * as_float(row[m]);
    }
  }
}

// A row of scores becomes exp(s - max) in place; returns 1 / their sum, or 0 where every slot is
// padding (-inf): that row reads nothing (zero weights, as the reference's nan_to_num).
float exponentials_portable(float* s, int64_t slots) {
  float top = -kInf;
  for (int64_t m = 0; m < slots; ++m) top = std::max(top, s[m]);
  if (top == -kInf) {
    std::fill(s, s + slots, 0.f);
    return 0.f;
  }
  float sum = 0.f;
  for (int64_t m = 0; m < slots; ++m) sum += (s[m] = exp_nonpositive(s[m] - top));
  return 1.f / sum;
}

// out_b = inverse_b * sum_m e[b][m] value_m (dim wide).
template <typename Elem>
void values_portable(const float* e, const float* inverse, int64_t beams, const Elem* values, int64_t dim,
                     int64_t slots, float* out, int64_t out_stride) {
  for (int64_t b = 0; b < beams; ++b) {
    float* o = out + b * out_stride;
    std::fill(o, o + dim, 0.f);
    const float* w = e + b * slots;
    for (int64_t m = 0; m < slots; ++m) {
      const Elem* v = values + m * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] += w[m] * as_float(v[d]);
    }
    for (int64_t d = 0; d < dim; ++d) o[d] *= inverse[b];
  }
}

#if defined(__x86_64__)
RELUFORMER_AVX2 inline float horizontal_max(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}

RELUFORMER_AVX2 inline float horizontal_sum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}

RELUFORMER_AVX2 float exponentials_avx2(float* s, int64_t slots) {
  const int64_t whole = slots - slots % 8;
  __m256 top8 = _mm256_set1_ps(-kInf);
  for (int64_t m = 0; m < whole; m += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(s + m));
  float top = horizontal_max(top8);
  for (int64_t m = whole; m < slots; ++m) top = std::max(top, s[m]);
  if (top == -kInf) {
    std::fill(s, s + slots, 0.f);
    return 0.f;
  }
  const __m256 shift = _mm256_set1_ps(top);
  __m256 sum8 = _mm256_setzero_ps();
  for (int64_t m = 0; m < whole; m += 8) {
    const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(s + m), shift));
    _mm256_storeu_ps(s + m, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  float sum = horizontal_sum(sum8);
  for (int64_t m = whole; m < slots; ++m) sum += (s[m] = exp_nonpositive(s[m] - top));
  return 1.f / sum;
}

// Sixteen output columns at a time where the head has them (two registers a beam): each broadcast
// weight serves both.
template <int Beams, typename Elem>
RELUFORMER_AVX2 void values_avx2(const float* e, const float* inverse, const Elem* values, int64_t dim,
                                  int64_t slots, float* out, int64_t out_stride) {
  int64_t d = 0;
  for (; d + 16 <= dim; d += 16) {
    __m256 low[Beams], high[Beams];
    for (int j = 0; j < Beams; ++j) low[j] = high[j] = _mm256_setzero_ps();
    for (int64_t m = 0; m < slots; ++m) {
      const __m256 v_low = load8(values + m * dim + d);
      const __m256 v_high = load8(values + m * dim + d + 8);
      for (int j = 0; j < Beams; ++j) {
        const __m256 w = _mm256_set1_ps(e[j * slots + m]);
        low[j] = _mm256_fmadd_ps(w, v_low, low[j]);
        high[j] = _mm256_fmadd_ps(w, v_high, high[j]);
      }
    }
    for (int j = 0; j < Beams; ++j) {
      const __m256 scale = _mm256_set1_ps(inverse[j]);
      _mm256_storeu_ps(out + j * out_stride + d, _mm256_mul_ps(low[j], scale));
      _mm256_storeu_ps(out + j * out_stride + d + 8, _mm256_mul_ps(high[j], scale));
    }
  }
  for (; d + 8 <= dim; d += 8) {
    __m256 acc[Beams];
    for (int j = 0; j < Beams; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t m = 0; m < slots; ++m) {
      const __m256 v = load8(values + m * dim + d);
      for (int j = 0; j < Beams; ++j) acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(e[j * slots + m]), v, acc[j]);
    }
    for (int j = 0; j < Beams; ++j) _mm256_storeu_ps(out + j * out_stride + d, _mm256_mul_ps(acc[j], _mm256_set1_ps(inverse[j])));
  }
  for (; d < dim; ++d) {
    for (int j = 0; j < Beams; ++j) {
      float o = 0.f;
      for (int64_t m = 0; m < slots; ++m) o += e[j * slots + m] * load1(values + m * dim + d);
      out[j * out_stride + d] = o * inverse[j];
    }
  }
}

template <int Beams, typename Elem>
RELUFORMER_AVX2 void attend_beams_avx2(const float* q, int64_t q_stride, const Elem* kt, int64_t key_stride,
                                        const Elem* values, int64_t dim, int64_t slots, const float* bias, float* e, float* inverse,
                                        float* out, int64_t out_stride) {
  const float* rows[Beams];
  float* scores[Beams];
  for (int j = 0; j < Beams; ++j) rows[j] = q + j * q_stride, scores[j] = e + j * slots;
  reluformer::row_products_avx2<Beams, Elem>(rows, kt, key_stride, dim, slots, bias, scores);
  for (int j = 0; j < Beams; ++j) inverse[j] = exponentials_avx2(e + j * slots, slots);
  values_avx2<Beams, Elem>(e, inverse, values, dim, slots, out, out_stride);
}

// The same group in AVX-512 where the CPU has it: sixteen slots (or a head's sixteen dimensions)
// a register, half the instructions of the AVX2 loops. The scores take 32 slots and the values two
// interleaved halves of the slots at a time, so that eight sums are in flight and the FMA latency
// stays hidden; the tails are masked loads and stores. The weights' sum adds its lanes in another
// order than the AVX2 loop: the same values up to float rounding.
template <int Beams, typename Elem>
RELUFORMER_AVX512 void attend_beams_avx512(const float* q, int64_t q_stride, const Elem* kt, int64_t key_stride,
                                          const Elem* values, int64_t dim, int64_t slots, const float* bias, float* e,
                                          float* inverse, float* out, int64_t out_stride) {
  const __m512 minus_inf = _mm512_set1_ps(-kInf);
  for (int64_t m = 0; m < slots; m += 32) {
    const __mmask16 low_mask = first_lanes(slots - m), high_mask = first_lanes(slots - m - 16);
    const __m512 start_low = bias != nullptr ? _mm512_maskz_loadu_ps(low_mask, bias + m) : _mm512_setzero_ps();
    const __m512 start_high = bias != nullptr ? _mm512_maskz_loadu_ps(high_mask, bias + m + 16) : _mm512_setzero_ps();
    __m512 low[Beams], high[Beams];
    for (int j = 0; j < Beams; ++j) low[j] = start_low, high[j] = start_high;
    for (int64_t d = 0; d < dim; ++d) {
      const __m512 key_low = load16(kt + d * key_stride + m, low_mask);
      const __m512 key_high = load16(kt + d * key_stride + m + 16, high_mask);
      for (int j = 0; j < Beams; ++j) {
        const __m512 a = _mm512_set1_ps(q[j * q_stride + d]);
        low[j] = _mm512_fmadd_ps(a, key_low, low[j]);
        high[j] = _mm512_fmadd_ps(a, key_high, high[j]);
      }
    }
    for (int j = 0; j < Beams; ++j) {
      _mm512_mask_storeu_ps(e + j * slots + m, low_mask, low[j]);
      _mm512_mask_storeu_ps(e + j * slots + m + 16, high_mask, high[j]);
    }
  }
  for (int j = 0; j < Beams; ++j) {
    float* s = e + j * slots;
    __m512 top16 = minus_inf;
    for (int64_t m = 0; m < slots; m += 16) top16 = _mm512_max_ps(top16, _mm512_mask_loadu_ps(minus_inf, first_lanes(slots - m), s + m));
    const float top = _mm512_reduce_max_ps(top16);
    if (top == -kInf) {
      std::fill(s, s + slots, 0.f);
      inverse[j] = 0.f;
      continue;
    }
    const __m512 shift = _mm512_set1_ps(top);
    __m512 sum16 = _mm512_setzero_ps();
    for (int64_t m = 0; m < slots; m += 16) {
      const __mmask16 mask = first_lanes(slots - m);
      const __m512 x = exp_nonpositive16(_mm512_sub_ps(_mm512_mask_loadu_ps(minus_inf, mask, s + m), shift));
      _mm512_mask_storeu_ps(s + m, mask, x);
      sum16 = _mm512_add_ps(sum16, x);  // masked-off lanes hold exp(-inf) = 0
    }
    inverse[j] = 1.f / _mm512_reduce_add_ps(sum16);
  }
  for (int64_t d = 0; d < dim; d += 16) {
    const __mmask16 mask = first_lanes(dim - d);
    __m512 even[Beams], odd[Beams];
    for (int j = 0; j < Beams; ++j) even[j] = odd[j] = _mm512_setzero_ps();
    int64_t m = 0;
    for (; m + 2 <= slots; m += 2) {
      const __m512 v_even = load16(values + m * dim + d, mask);
      const __m512 v_odd = load16(values + (m + 1) * dim + d, mask);
      for (int j = 0; j < Beams; ++j) {
        even[j] = _mm512_fmadd_ps(_mm512_set1_ps(e[j * slots + m]), v_even, even[j]);
        odd[j] = _mm512_fmadd_ps(_mm512_set1_ps(e[j * slots + m + 1]), v_odd, odd[j]);
      }
    }
    if (m < slots) {
      const __m512 v = load16(values + m * dim + d, mask);
      for (int j = 0; j < Beams; ++j) even[j] = _mm512_fmadd_ps(_mm512_set1_ps(e[j * slots + m]), v, even[j]);
    }
    for (int j = 0; j < Beams; ++j)
      _mm512_mask_storeu_ps(out + j * out_stride + d, mask,
                            _mm512_mul_ps(_mm512_add_ps(even[j], odd[j]), _mm512_set1_ps(inverse[j])));
  }
}

#endif

// One group over its first ``slots`` slots (keys_t's rows ``key_stride`` apart): ``e`` (beams, slots) scratch, left holding the rows' exponentials, ``inverse`` (beams)
// their normalisers (weights = e * inverse); out rows out_stride apart.
template <typename Elem>
void attend_group(const float* q, int64_t q_stride, int64_t beams, const Elem* kt, int64_t key_stride,
                  const Elem* values, int64_t dim, int64_t slots, const float* bias, float* e, float* inverse, float* out, int64_t out_stride) {
#if defined(__x86_64__)
  // the vector loops take up to four beams at a time (each key and value load serves them all),
  // their number ``n`` a compile-time constant
  const auto in_fours = [&](auto attend_beams) {
    for (int64_t b = 0; b < beams; b += 4) {
      const float* qb = q + b * q_stride;
      float* eb = e + b * slots;
      float* ob = out + b * out_stride;
      switch (std::min<int64_t>(4, beams - b)) {
        case 4: attend_beams(std::integral_constant<int, 4>(), qb, eb, inverse + b, ob); break;
        case 3: attend_beams(std::integral_constant<int, 3>(), qb, eb, inverse + b, ob); break;
        case 2: attend_beams(std::integral_constant<int, 2>(), qb, eb, inverse + b, ob); break;
        default: attend_beams(std::integral_constant<int, 1>(), qb, eb, inverse + b, ob); break;
      }
    }
  };
  if (has_avx512()) {
    in_fours([&](auto n, const float* qb, float* eb, float* ib, float* ob) {
      attend_beams_avx512<decltype(n)::value, Elem>(qb, q_stride, kt, key_stride, values, dim, slots, bias, eb, ib, ob, out_stride);
    });
    return;
  }
  if (has_avx2()) {
    in_fours([&](auto n, const float* qb, float* eb, float* ib, float* ob) {
      attend_beams_avx2<decltype(n)::value, Elem>(qb, q_stride, kt, key_stride, values, dim, slots, bias, eb, ib, ob, out_stride);
    });
    return;
  }
#endif
  scores_portable<Elem>(q, q_stride, beams, kt, key_stride, dim, slots, bias, e);
  for (int64_t b = 0; b < beams; ++b) inverse[b] = exponentials_portable(e + b * slots, slots);
  values_portable<Elem>(e, inverse, beams, values, dim, slots, out, out_stride);
}

// a . b over n floats in eight independent sums (one sum's chain of dependent adds cost ~4 cycles a
// float; eight lanes the compiler vectorises)
inline float dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[c + l] * b[c + l];
  }
  float sum = 0.f;
  for (int l = 0; l < 8; ++l) sum += lanes[l];
  for (; c < n; ++c) sum += a[c] * b[c];
  return sum;
}

inline float log_sigmoid(float z) {
  return z < 0.f ? z - std::log1p(std::exp(z)) : -std::log1p(std::exp(-z));
}

inline float log_add_exp(float a, float b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  const float top = std::max(a, b);
  return top + std::log1p(std::exp(-std::fabs(a - b)));
}

// Every (sentence, head) group's attention into ``attended`` (rows, C) and the head-averaged weights
// into ``averaged``; keys and values float32 or half floats (Elem = uint16_t, their bits).
template <typename Elem>
void attend_sentences(const torch::Tensor& q, const Elem* k_data, const Elem* v_data, const torch::Tensor& bias,
                      bool has_bias, int64_t sentences, int64_t heads, int64_t beams, int64_t head_dim, int64_t slots,
                      int64_t channels, torch::Tensor& attended, torch::Tensor& averaged, bool keep_weights) {
  const float* q_data = q.data_ptr<float>();
  const float* bias_data = has_bias ? bias.data_ptr<float>() : nullptr;
  float* out_data = attended.data_ptr<float>();
  float* avg_data = keep_weights ? averaged.data_ptr<float>() : nullptr;
  const float inverse_heads = 1.f / static_cast<float>(heads);
  // a sentence's heads write the same averaged rows: parallel over sentences only
  at::parallel_for(0, sentences, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> e(beams * slots), inverse(beams);
    for (int64_t s = begin; s < end; ++s) {
      // the sentence's trailing padding slots (weight 0) are not read
      int64_t used = slots;
      if (has_bias) {
        const float* sentence_bias = bias_data + s * heads * slots;
        while (used > 0 && sentence_bias[used - 1] == -kInf) --used;
      }
      for (int64_t head = 0; head < heads; ++head) {
        const int64_t g = s * heads + head;
        const float* q_rows = q_data + s * beams * channels + head * head_dim;
        attend_group(q_rows, channels, beams, k_data + g * head_dim * slots, slots, v_data + g * slots * head_dim,
                     head_dim, used, has_bias ? bias_data + g * slots : nullptr, e.data(), inverse.data(),
                     out_data + s * beams * channels + head * head_dim, channels);
        if (avg_data != nullptr) {  // the mean over heads of the weights e * inverse
          for (int64_t b = 0; b < beams; ++b) {
            float* avg = avg_data + (s * beams + b) * slots;
            const float* w = e.data() + b * used;
            const float scale = inverse[b] * inverse_heads;
            for (int64_t m = 0; m < used; ++m) avg[m] += w[m] * scale;
          }
        }
      }
    }
  });
}

}  // namespace

// x (rows, C) with rows = sentences x beams (a sentence's beams adjacent); keys_t (sentences x heads,
// head_dim, slots), values (sentences x heads, slots, head_dim), float32 or float16 (a cache kept in
// half precision: half the bytes a step reads; the arithmetic stays float32), bias (sentences x heads, slots) of 0 and
// -inf (padding), the same for a sentence's heads, or an empty tensor. Returns (x + g * o (rows, C), head-averaged weights (rows, slots),
// empty unless keep_weights).
std::vector<torch::Tensor> read_step(torch::Tensor x, torch::Tensor norm_weight, torch::Tensor norm_bias, double eps,
                                     torch::Tensor q_weight, c10::optional<torch::Tensor> q_bias, double scaling,
                                     torch::Tensor keys_t, torch::Tensor values, torch::Tensor bias,
                                     torch::Tensor out_weight, c10::optional<torch::Tensor> out_bias,
                                     torch::Tensor gate_weight, torch::Tensor gate_bias, int64_t heads,
                                     bool keep_weights) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "read_step: x (rows, C) float32");
  TORCH_CHECK(keys_t.dim() == 3 && values.dim() == 3 && keys_t.is_contiguous() && values.is_contiguous(),
              "read_step: contiguous keys_t (groups, D, M) and values (groups, M, D)");
  TORCH_CHECK(keys_t.scalar_type() == values.scalar_type() &&
                  (keys_t.scalar_type() == torch::kFloat || keys_t.scalar_type() == torch::kHalf),
              "read_step: keys and values both float32 or both float16");
  const int64_t rows = x.size(0), channels = x.size(1);
  const int64_t groups = keys_t.size(0), head_dim = keys_t.size(1), slots = keys_t.size(2);
  TORCH_CHECK(groups % heads == 0 && heads * head_dim == channels, "read_step: keys do not match the heads");
  const int64_t sentences = groups / heads;
  TORCH_CHECK(sentences > 0 && rows % sentences == 0, "read_step: rows are not a whole number of beams per sentence");
  const int64_t beams = rows / sentences;
  const bool has_bias = bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.is_contiguous() && bias.numel() == groups * slots), "read_step: bias (groups, M)");

  const torch::Tensor h = at::layer_norm(x, {channels}, norm_weight, norm_bias, eps);
  const torch::Tensor q = at::linear(h, q_weight, q_bias).mul_(scaling).contiguous();
  torch::Tensor attended = torch::empty({rows, channels}, x.options());
  torch::Tensor averaged = keep_weights ? torch::zeros({rows, slots}, x.options()) : torch::empty({0}, x.options());

  if (keys_t.scalar_type() == torch::kHalf) {
    attend_sentences(q, reinterpret_cast<const uint16_t*>(keys_t.data_ptr<at::Half>()),
                     reinterpret_cast<const uint16_t*>(values.data_ptr<at::Half>()), bias, has_bias, sentences, heads,
                     beams, head_dim, slots, channels, attended, averaged, keep_weights);
  } else {
    attend_sentences(q, keys_t.data_ptr<float>(), values.data_ptr<float>(), bias, has_bias, sentences, heads, beams,
                     head_dim, slots, channels, attended, averaged, keep_weights);
  }

  const torch::Tensor o = at::linear(attended, out_weight, out_bias).contiguous();
  // g = sigmoid(w . [h; o] + b) per row; x + g * o
  torch::Tensor result = torch::empty_like(x);
  const torch::Tensor hc = h.contiguous(), xc = x.contiguous();
  const torch::Tensor gw = gate_weight.reshape({-1}).contiguous();
  TORCH_CHECK(gw.numel() == 2 * channels, "read_step: gate weight (1, 2C)");
  const float* h_data = hc.data_ptr<float>();
  const float* o_data = o.data_ptr<float>();
  const float* x_data = xc.data_ptr<float>();
  const float* gw_data = gw.data_ptr<float>();
  const float gb = gate_bias.item<float>();
  float* r_data = result.data_ptr<float>();
  for (int64_t row = 0; row < rows; ++row) {
    const float* hr = h_data + row * channels;
    const float* orow = o_data + row * channels;
    const float z = gb + dot(gw_data, hr, channels) + dot(gw_data + channels, orow, channels);
    const float gate = 1.f / (1.f + std::exp(-z));
    const float* xr = x_data + row * channels;
    float* rr = r_data + row * channels;
    for (int64_t c = 0; c < channels; ++c) rr[c] = xr[c] + gate * orow[c];
  }
  return {result, averaged};
}

// lprobs (rows, V) float32 log_softmax of the step's logits, corrected in place; weights (rows, M) the
// last reader's head-averaged weights; columns (sentences, M): each copyable slot's first slot holding
// its token (M: never copied); column_tokens (sentences, M): the token of each such first slot;
// gate_logit (rows) the copy gate's logit z (c = sigmoid(z)). Returns the rows that copy.
int64_t copy_step(torch::Tensor lprobs, torch::Tensor weights, torch::Tensor columns, torch::Tensor column_tokens,
                  torch::Tensor gate_logit) {
  TORCH_CHECK(lprobs.dim() == 2 && lprobs.is_contiguous() && lprobs.scalar_type() == torch::kFloat,
              "copy_step: lprobs (rows, V) contiguous float32");
  const int64_t rows = lprobs.size(0), vocab = lprobs.size(1);
  const int64_t sentences = columns.size(0), slots = columns.size(1);
  TORCH_CHECK(sentences > 0 && rows % sentences == 0 && weights.size(0) == rows && weights.size(1) == slots,
              "copy_step: weights (rows, M) for whole sentences' beams");
  const int64_t beams = rows / sentences;
  const torch::Tensor w = weights.contiguous(), cols = columns.contiguous(), toks = column_tokens.contiguous();
  const torch::Tensor z = gate_logit.reshape({-1}).contiguous();
  const float* w_data = w.data_ptr<float>();
  const int64_t* col_data = cols.data_ptr<int64_t>();
  const int64_t* tok_data = toks.data_ptr<int64_t>();
  const float* z_data = z.data_ptr<float>();
  float* lp_data = lprobs.data_ptr<float>();
  int64_t copying = 0;
  std::vector<float> mass(slots + 1);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t s = row / beams;
    const int64_t* col = col_data + s * slots;
    const float* wr = w_data + row * slots;
    std::fill(mass.begin(), mass.end(), 0.f);
    for (int64_t m = 0; m < slots; ++m) mass[col[m]] += wr[m];
    float total = 0.f;
    for (int64_t m = 0; m < slots; ++m) total += mass[m];
    if (!(total > 0.f)) continue;  // reads nothing copyable: the model's distribution as it is
    ++copying;
    float* lp = lp_data + row * vocab;
    const float log_stay = log_sigmoid(-z_data[row]);
    for (int64_t y = 0; y < vocab; ++y) lp[y] += log_stay;
    const float log_copy = log_sigmoid(z_data[row]) - std::log(total);
    // c * mass / total added to the token's probability in linear space: two calls (exp, log) a
    // token instead of three; where the share is not a normal float, in log space as the reference.
    // A subnormal total makes c / total overflow (inf): the whole row then goes the log-space way
    const float copy_scale = std::exp(log_copy);
    const bool linear = std::isfinite(copy_scale);
    const int64_t* tok = tok_data + s * slots;
    for (int64_t m = 0; m < slots; ++m) {
      if (!(mass[m] > 0.f)) continue;
      const float share = copy_scale * mass[m];
      float& y = lp[tok[m]];
      y = linear && share >= kSmallestShare ? std::log(std::exp(y) + share)
                                            : log_add_exp(y, std::log(mass[m]) + log_copy);
    }
  }
  return copying;
}

// The dense (queries, entries) scores of a sparse retrieval space (reluformer_mt/memory/sparse_scores.py):
// queries (n, units) times the entries' unit weights (units, entries), both CSR, summed in a dense
// row per query in scipy's order (each query unit in turn, its entries in stored order: the same
// float32 sums), without scipy's sparse result, which was built and then made dense.
template <typename Index>
void sparse_rows_times_csr(const int64_t* q_indptr, const Index* q_indices, const float* q_data, const int64_t* m_indptr,
                           const Index* m_indices, const float* m_data, int64_t rows, int64_t entries, float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = out + i * entries;
    for (int64_t jj = q_indptr[i]; jj < q_indptr[i + 1]; ++jj) {
      const int64_t unit = q_indices[jj];
      const float w = q_data[jj];
      for (int64_t kk = m_indptr[unit]; kk < m_indptr[unit + 1]; ++kk) row[m_indices[kk]] += w * m_data[kk];
    }
  }
}

torch::Tensor sparse_scores(torch::Tensor q_indptr, torch::Tensor q_indices, torch::Tensor q_data, torch::Tensor m_indptr,
                            torch::Tensor m_indices, torch::Tensor m_data, int64_t entries) {
  TORCH_CHECK(q_indptr.scalar_type() == torch::kLong && m_indptr.scalar_type() == torch::kLong &&
                  q_data.scalar_type() == torch::kFloat && m_data.scalar_type() == torch::kFloat &&
                  q_indices.scalar_type() == m_indices.scalar_type(),
              "sparse_scores: int64 index pointers, float32 data, one index type");
  const int64_t rows = q_indptr.numel() - 1;
  torch::Tensor out = torch::zeros({rows, entries}, q_data.options());
  if (q_indices.scalar_type() == torch::kInt) {
    sparse_rows_times_csr<int32_t>(q_indptr.data_ptr<int64_t>(), q_indices.data_ptr<int32_t>(), q_data.data_ptr<float>(),
                                   m_indptr.data_ptr<int64_t>(), m_indices.data_ptr<int32_t>(), m_data.data_ptr<float>(),
                                   rows, entries, out.data_ptr<float>());
  } else {
    TORCH_CHECK(q_indices.scalar_type() == torch::kLong, "sparse_scores: int32 or int64 indices");
    sparse_rows_times_csr<int64_t>(q_indptr.data_ptr<int64_t>(), q_indices.data_ptr<int64_t>(), q_data.data_ptr<float>(),
                                   m_indptr.data_ptr<int64_t>(), m_indices.data_ptr<int64_t>(), m_data.data_ptr<float>(),
                                   rows, entries, out.data_ptr<float>());
  }
  return out;
}

// Which loops read_step runs on this CPU (the translation summary names them)
std::string cpu_loops() { return has_avx512() ? "AVX-512" : has_avx2() ? "AVX2" : "portable"; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cpu_loops", &cpu_loops, "the loops read_step runs on this CPU: AVX-512, AVX2 or portable");
  m.def("sparse_scores", &sparse_scores, "dense scores of CSR queries against CSR entry weights (CPU)");
  m.def("read_step", &read_step, "a softmax memory reader's cached decoding step with its gate (CPU)");
  m.def("copy_step", &copy_step, "the copy distribution's correction of one step's log-probabilities in place (CPU)");
}
