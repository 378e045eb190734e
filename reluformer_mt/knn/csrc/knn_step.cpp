// One kNN-MT beam step on the CPU in two calls instead of a few dozen small tensor operations:
//   * unit_neighbours: each row's k nearest entries among the keys of its own unit (a per-input
//     datastore, or a corpus datastore restricted to a sentence's memory matches), read in place
//     from the padded table of the units' transposed keys -- no grouping of rows, no copy of keys, no padding
//     slot searched;
//   * mix_votes: the neighbours' shares mixed into the rows' log-probabilities in place, touching
//     only the voted tokens beyond one add per row, and the count of rows whose best token the
//     neighbours changed; mix_readout: the same after the softmax or ReLU read-out's weights and
//     the mixer's share, computed in the same loop.
// The Python code they replace (reluformer_mt/knn/search.py, readout.mix_neighbours) stays the
// reference and the fallback; tests/test_knn_fused.py compares the two.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "../../attention/csrc/cpu_math.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

// p[g][j] = q_g . key_j for up to kGroup queries of one unit at once: each key row is loaded once
// for the group (the beams of a sentence read the same unit). Where the CPU has AVX2/FMA the
// products stay in registers across the key dimension (cpu_math.h); elsewhere the j loop is
// vectorised by the compiler.
constexpr int kGroup = 4;
constexpr int64_t kInsertionUpTo = 32;  // up to this many neighbours a row keeps a sorted list, beyond it selects

void group_products(const float* const* q, int groups, const float* kt, int64_t dim, int64_t n, int64_t m,
                    float* const* p) {
#if defined(__x86_64__)
  if (reluformer::has_avx2()) {
    switch (groups) {
      case 4: reluformer::row_products_avx2<4>(q, kt, n, dim, m, nullptr, p); return;
      case 3: reluformer::row_products_avx2<3>(q, kt, n, dim, m, nullptr, p); return;
      case 2: reluformer::row_products_avx2<2>(q, kt, n, dim, m, nullptr, p); return;
      default: reluformer::row_products_avx2<1>(q, kt, n, dim, m, nullptr, p); return;
    }
  }
#endif
  for (int g = 0; g < groups; ++g) std::fill(p[g], p[g] + m, 0.f);
  if (groups == kGroup) {
    float* p0 = p[0];
    float* p1 = p[1];
    float* p2 = p[2];
    float* p3 = p[3];
    for (int64_t d = 0; d < dim; ++d) {
      const float a = q[0][d], b = q[1][d], c = q[2][d], e = q[3][d];
      const float* row = kt + d * n;
      for (int64_t j = 0; j < m; ++j) {
        const float x = row[j];
        p0[j] += a * x;
        p1[j] += b * x;
        p2[j] += c * x;
        p3[j] += e * x;
      }
    }
    return;
  }
  for (int g = 0; g < groups; ++g) {
    float* pg = p[g];
    for (int64_t d = 0; d < dim; ++d) {
      const float a = q[g][d];
      const float* row = kt + d * n;
      for (int64_t j = 0; j < m; ++j) pg[j] += a * row[j];
    }
  }
}

// The slots of the ``take`` smallest of ``m`` non-negative distances (ties: the lower slot), in no
// particular order, written to ``out`` as (bits << 32 | slot); returns take. Non-negative floats
// order as their bits, so a histogram of the bits' range in kBuckets buckets finds the bucket the
// take-th smallest lies in; the entries below it are taken as they come and only that bucket's
// few entries are sorted. Two passes over the row and one over the buckets, where a selection
// (nth_element) at k 256 of ~350 cost more than the row's products.
constexpr int64_t kBuckets = 1024;

int64_t select_by_histogram(const float* distance, int64_t m, int64_t take, std::vector<int32_t>& histogram,
                            std::vector<uint64_t>& out) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(distance);
  uint32_t low = UINT32_MAX, high = 0;
  for (int64_t j = 0; j < m; ++j) {
    low = std::min(low, bits[j]);
    high = std::max(high, bits[j]);
  }
  int shift = 0;
  while (((high - low) >> shift) >= static_cast<uint32_t>(kBuckets)) ++shift;
  std::fill(histogram.begin(), histogram.end(), 0);
  for (int64_t j = 0; j < m; ++j) ++histogram[(bits[j] - low) >> shift];
  uint32_t bucket = 0;
  int64_t below = 0;  // entries in the buckets before ``bucket``
  while (below + histogram[bucket] < take) below += histogram[bucket++];
  int64_t n_out = 0, n_tied = below;
  for (int64_t j = 0; j < m; ++j) {
    const uint32_t b = (bits[j] - low) >> shift;
    const uint64_t entry = (static_cast<uint64_t>(bits[j]) << 32) | static_cast<uint64_t>(j);
    if (b < bucket) {
      out[n_out++] = entry;
    } else if (b == bucket) {
      out[n_tied++] = entry;  // after the slots kept for the entries below
    }
  }
  std::sort(out.begin() + below, out.begin() + n_tied);
  return take;
}

// states (R, D) float; units (R,) int64; keys_t (U, D, N) (each unit's keys transposed: the products
// of a row with its unit's keys are then D axpys over contiguous memory, which the compiler
// vectorises, instead of N dot products); norms (U, N) float; counts (U,) int64 (the real entries
// of each unit, first in its row); values (U, N) int64; trust (U, N) float.
// Returns (distances (R, K), values (R, K), trust (R, K)), K = min(k, N): each row's K nearest,
// nearest first (ties by slot) when ``ordered``, else in no particular order (a read-out that
// only sums over the neighbours needs no sort: at k 256 sorting cost more than the products); rows whose unit has fewer than K entries are filled with (inf, -1, 0). The distance is
// |s|^2 + |key|^2 - 2 s.key floored at 0, the same formula as the Python search.
std::vector<torch::Tensor> unit_neighbours(torch::Tensor states, torch::Tensor units, torch::Tensor keys_t,
                                           torch::Tensor norms, torch::Tensor counts, torch::Tensor values,
                                           torch::Tensor trust, int64_t k, bool ordered) {
  TORCH_CHECK(states.dim() == 2 && keys_t.dim() == 3 && states.size(1) == keys_t.size(1), "unit_neighbours: bad shapes");
  TORCH_CHECK(keys_t.is_contiguous() && norms.is_contiguous() && values.is_contiguous() && trust.is_contiguous(),
              "unit_neighbours: the unit tables must be contiguous");
  states = states.contiguous();
  units = units.contiguous();
  const int64_t rows = states.size(0), dim = states.size(1), n = keys_t.size(2);
  TORCH_CHECK(units.size(0) == rows, "unit_neighbours: ", units.size(0), " units for ", rows, " rows");
  TORCH_CHECK(rows == 0 || (units.min().item<int64_t>() >= 0 && units.max().item<int64_t>() < keys_t.size(0)),
              "unit_neighbours: a unit index outside the table");
  const int64_t kk = std::min<int64_t>(k, n);
  auto out_d = torch::full({rows, kk}, kInf, states.options());
  auto out_v = torch::full({rows, kk}, -1, values.options());
  auto out_t = torch::zeros({rows, kk}, trust.options());
  const float* s = states.data_ptr<float>();
  const int64_t* u = units.data_ptr<int64_t>();
  const float* key_t = keys_t.data_ptr<float>();
  const float* norm = norms.data_ptr<float>();
  const int64_t* count = counts.data_ptr<int64_t>();
  const int64_t* value = values.data_ptr<int64_t>();
  const float* tr = trust.data_ptr<float>();
  float* od = out_d.data_ptr<float>();
  int64_t* ov = out_v.data_ptr<int64_t>();
  float* ot = out_t.data_ptr<float>();
  // runs of consecutive rows reading the same unit, at most kGroup long: the parallel tasks
  std::vector<int64_t> run_start;
  for (int64_t r = 0; r < rows; ++r) {
    if (r == 0 || u[r] != u[r - 1] || r - run_start.back() == kGroup) run_start.push_back(r);
  }
  run_start.push_back(rows);
  const int64_t runs = static_cast<int64_t>(run_start.size()) - 1;
  at::parallel_for(0, runs, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> product(kGroup * n);
    std::vector<uint64_t> ranked(n);
    std::vector<int64_t> best(std::min<int64_t>(kk, kInsertionUpTo));
    std::vector<int32_t> histogram(kBuckets + 1);
    for (int64_t run = begin; run < end; ++run) {
      const int64_t first = run_start[run];
      const int groups = static_cast<int>(run_start[run + 1] - first);
      const int64_t unit = u[first];
      const int64_t m = std::min<int64_t>(count[unit], n);
      const float* q[kGroup];
      float* p[kGroup];
      for (int g = 0; g < groups; ++g) {
        q[g] = s + (first + g) * dim;
        p[g] = product.data() + g * n;
      }
      group_products(q, groups, key_t + unit * dim * n, dim, n, m, p);
      const float* nu = norm + unit * n;
      const int64_t take = std::min(kk, m);
      for (int g = 0; g < groups; ++g) {
        const int64_t r = first + g;
        float q2 = 0.f;
        for (int64_t d = 0; d < dim; ++d) q2 += q[g][d] * q[g][d];
        float* distance = p[g];  // in place of the products
        for (int64_t j = 0; j < m; ++j) {
          // a NaN (a NaN or inf key) is farthest of all, as in the Python search: inf, no neighbour
          const float dj = q2 + nu[j] - 2.f * distance[j];
          distance[j] = dj > 0.f ? dj : dj <= 0.f ? 0.f : kInf;
        }
        float* row_d = od + r * kk;
        int64_t* row_v = ov + r * kk;
        float* row_t = ot + r * kk;
        auto emit = [&](int64_t i, int64_t j) {
          row_d[i] = distance[j];
          row_v[i] = std::isinf(distance[j]) ? -1 : value[unit * n + j];
          row_t[i] = tr[unit * n + j];
        };
        if (take == m && !ordered) {  // every entry, in slot order
          for (int64_t j = 0; j < m; ++j) emit(j, j);
        } else if (take <= kInsertionUpTo) {  // a sorted list of the nearest so far: a few inserts a row
          int64_t size = 0;
          for (int64_t j = 0; j < m; ++j) {
            const float dj = distance[j];
            if (size == take && !(dj < distance[best[size - 1]])) continue;  // ties keep the earlier slot
            int64_t at = size < take ? size++ : size - 1;
            while (at > 0 && dj < distance[best[at - 1]]) {
              best[at] = best[at - 1];
              --at;
            }
            best[at] = j;
          }
          for (int64_t i = 0; i < take; ++i) emit(i, best[i]);
        } else if (!ordered) {  // the take nearest in any order: a histogram of the distances' bits
          const int64_t emitted = select_by_histogram(distance, m, take, histogram, ranked);
          for (int64_t i = 0; i < emitted; ++i) emit(i, static_cast<int64_t>(ranked[i] & 0xffffffffu));
        } else {
          for (int64_t j = 0; j < m; ++j) {
            uint32_t bits;  // non-negative floats order as their bits: (bits, slot) orders ties by slot
            std::memcpy(&bits, distance + j, sizeof bits);
            ranked[j] = (static_cast<uint64_t>(bits) << 32) | static_cast<uint64_t>(j);
          }
          if (take < m) std::nth_element(ranked.begin(), ranked.begin() + take, ranked.begin() + m);
          if (ordered) std::sort(ranked.begin(), ranked.begin() + take);
          for (int64_t i = 0; i < take; ++i) emit(i, static_cast<int64_t>(ranked[i] & 0xffffffffu));
        }
      }
    }
  });
  return {out_d, out_v, out_t};
}

// Per-task scratch of the mixture: the neighbours' mass per token and which tokens a row voted for
// (vocabulary-sized, reset after each row by visiting only the voted tokens).
struct MixScratch {
  std::vector<float> p_knn;
  std::vector<char> seen;
  std::vector<int64_t> tokens;
  std::vector<float> voted;
  std::vector<char> was_best;
  explicit MixScratch(int64_t vocab) : p_knn(vocab, 0.f), seen(vocab, 0) {}
};

// One row x (V scores) becomes log(share p_model + sum_i w_i [y = v_i]) in place: a token ruled
// out (-inf) stays out; a missing neighbour (v -1) points at token 0 with no weight. ``best``: the
// row's best score before. True when a voted token that was not the best now scores above the
// best (the Python mixer's statistic, readout.mix_neighbours and search.KnnMixer).
bool mix_row(float* x, int64_t vocab, const float* w, const int64_t* v, int64_t k, float share, float best,
             MixScratch& scratch) {
  auto& tokens = scratch.tokens;
  tokens.clear();
  for (int64_t j = 0; j < k; ++j) {  // each voted token once
    const int64_t y = v[j] < 0 ? 0 : v[j];
    TORCH_CHECK(y < vocab, "kNN-MT mixture: a neighbour's token ", y, " is outside the vocabulary of ", vocab);
    if (!scratch.seen[y]) {
      scratch.seen[y] = 1;
      tokens.push_back(y);
    }
    if (v[j] >= 0) scratch.p_knn[y] += w[j];
  }
  const float log_share = std::log(share);
  scratch.voted.resize(tokens.size());
  scratch.was_best.resize(tokens.size());
  for (size_t t = 0; t < tokens.size(); ++t) {
    const float before = x[tokens[t]];
    scratch.was_best[t] = before == best;
    scratch.voted[t] = std::isinf(before) && before < 0 ? -kInf
                                                         : std::log(share * std::exp(before) + scratch.p_knn[tokens[t]]);
  }
  for (int64_t y = 0; y < vocab; ++y) x[y] += log_share;
  float best_after = -kInf, other_after = -kInf;
  bool any_best = false;
  for (size_t t = 0; t < tokens.size(); ++t) {
    x[tokens[t]] = scratch.voted[t];
    scratch.p_knn[tokens[t]] = 0.f;
    scratch.seen[tokens[t]] = 0;
    if (scratch.was_best[t]) {
      any_best = true;
      best_after = std::max(best_after, scratch.voted[t]);
    } else {
      other_after = std::max(other_after, scratch.voted[t]);
    }
  }
  if (!any_best) best_after = best + log_share;
  return other_after > best_after;
}

void check_rows(const torch::Tensor& lprobs, const torch::Tensor& rows, int64_t m, const char* what) {
  TORCH_CHECK(lprobs.dim() == 2 && lprobs.is_contiguous() && lprobs.scalar_type() == torch::kFloat, what,
              ": lprobs must be a contiguous float (rows, vocab) tensor");
  TORCH_CHECK(rows.size(0) == m, what, ": ", rows.size(0), " row indices for ", m, " rows of neighbours");
  TORCH_CHECK(m == 0 || (rows.min().item<int64_t>() >= 0 && rows.max().item<int64_t>() < lprobs.size(0)), what,
              ": a row index outside lprobs");
}

// lprobs (the step's rows, V) mixed in place at ``rows`` (M,) with the neighbours' shares ``weights``
// (M, k) of tokens ``values`` (M, k), the model keeping ``model_share`` (M,); ``top`` (M,) each row's
// best score before. Returns the number of rows whose best token the neighbours changed.
int64_t mix_votes(torch::Tensor lprobs, torch::Tensor rows, torch::Tensor weights, torch::Tensor values,
                  torch::Tensor model_share, torch::Tensor top) {
  weights = weights.contiguous();
  values = values.contiguous();
  const int64_t m = weights.size(0), k = weights.size(1), vocab = lprobs.size(1);
  check_rows(lprobs, rows, m, "mix_votes");
  TORCH_CHECK(values.size(0) == m && values.size(1) == k && model_share.numel() == m && top.numel() == m,
              "mix_votes: the weights, values, shares and best scores differ in shape");
  float* lp = lprobs.data_ptr<float>();
  const int64_t* row = rows.data_ptr<int64_t>();
  const float* w = weights.data_ptr<float>();
  const int64_t* v = values.data_ptr<int64_t>();
  const float* share = model_share.data_ptr<float>();
  const float* best = top.data_ptr<float>();
  std::vector<int64_t> changed(m, 0);
  at::parallel_for(0, m, 8, [&](int64_t begin, int64_t end) {
    MixScratch scratch(vocab);
    for (int64_t i = begin; i < end; ++i) {
      changed[i] = mix_row(lp + row[i] * vocab, vocab, w + i * k, v + i * k, k, share[i], best[i], scratch);
    }
  });
  return std::accumulate(changed.begin(), changed.end(), int64_t{0});
}

// The fixed read-outs of readout.neighbour_weights and the mixer's share in the same loop as the
// mixture: ``relu`` false, softmax(-d / T) (computed as exp((d_min - d) / T) / sum: the same
// weights, never overflowing); ``relu`` true, a = ReLU(1 - d / radius) normalised by its sum, mass
// max a. Missing neighbours (d inf) weigh nothing; a row with none gets mass 0. With ``trust``
// (M, k; an empty tensor: none) the mass is scaled by sum_i w_i trust_i. The neighbours' share is
// lam * mass, at most 1 - floor (the model keeps ``floor``). Returns (rows whose best token the
// neighbours changed, rows where the neighbours had mass).
std::vector<int64_t> mix_readout(torch::Tensor lprobs, torch::Tensor rows, torch::Tensor distances, torch::Tensor values,
                                 torch::Tensor trust, torch::Tensor top, double lam, bool relu, double temperature,
                                 double radius, double floor) {
  distances = distances.contiguous();
  values = values.contiguous();
  const int64_t m = distances.size(0), k = distances.size(1), vocab = lprobs.size(1);
  check_rows(lprobs, rows, m, "mix_readout");
  const bool trusted = trust.numel() > 0;
  if (trusted) trust = trust.contiguous();
  TORCH_CHECK(values.size(0) == m && values.size(1) == k && top.numel() == m && (!trusted || trust.numel() == m * k),
              "mix_readout: the distances, values, trust and best scores differ in shape");
  float* lp = lprobs.data_ptr<float>();
  const int64_t* row = rows.data_ptr<int64_t>();
  const float* dist = distances.data_ptr<float>();
  const int64_t* v = values.data_ptr<int64_t>();
  const float* tr = trusted ? trust.data_ptr<float>() : nullptr;
  const float* best = top.data_ptr<float>();
  std::vector<int64_t> changed(m, 0), with_mass(m, 0);
  at::parallel_for(0, m, 8, [&](int64_t begin, int64_t end) {
    MixScratch scratch(vocab);
    std::vector<float> w(k);
    for (int64_t i = begin; i < end; ++i) {
      const float* d = dist + i * k;
      float total = 0.f, mass = 0.f;
      if (relu) {
        for (int64_t j = 0; j < k; ++j) {
          w[j] = std::isfinite(d[j]) ? std::max(1.f - d[j] / static_cast<float>(radius), 0.f) : 0.f;
          total += w[j];
          mass = std::max(mass, w[j]);
        }
      } else {
        float nearest = kInf;
        for (int64_t j = 0; j < k; ++j) nearest = std::min(nearest, d[j]);
        if (std::isfinite(nearest)) {
          // 1 / T overflows for T below ~2.9e-39 (0 * inf: NaN at the nearest): divide there, as the reference
          const float t = static_cast<float>(temperature), inverse_temperature = 1.f / t;
          const bool multiply = std::isfinite(inverse_temperature);
          for (int64_t j = 0; j < k; ++j) {
            const float gap = nearest - d[j];
            w[j] = !std::isfinite(d[j]) ? -kInf
                   : multiply          ? gap * inverse_temperature
                                       : static_cast<float>(static_cast<double>(gap) / temperature);
          }
          reluformer::exp_nonpositive_inplace(w.data(), k);  // the exponentials in vector lanes
          for (int64_t j = 0; j < k; ++j) total += w[j];
          mass = 1.f;
        } else {
          std::fill(w.begin(), w.end(), 0.f);
        }
      }
      if (total > 0.f) {
        for (int64_t j = 0; j < k; ++j) w[j] /= total;
      } else {
        mass = 0.f;
      }
      if (trusted) {
        float voice = 0.f;
        for (int64_t j = 0; j < k; ++j) voice += w[j] * tr[i * k + j];
        mass *= voice;
      }
      with_mass[i] = mass > 0.f;
      const float share = std::min(std::max(static_cast<float>(lam) * mass, 0.f), 1.f - static_cast<float>(floor));
      for (int64_t j = 0; j < k; ++j) w[j] *= share;
      changed[i] = mix_row(lp + row[i] * vocab, vocab, w.data(), v + i * k, k, 1.f - share, best[i], scratch);
    }
  });
  return {std::accumulate(changed.begin(), changed.end(), int64_t{0}),
          std::accumulate(with_mass.begin(), with_mass.end(), int64_t{0})};
}

// Adaptive kNN-MT's step (Zheng et al., ACL 2021; reluformer_mt/knn/adaptive.py): the Meta-k
// network's features of the k_max nearest neighbours (distances / scale capped at 1e3, and the
// distinct tokens among the first 1..k_max), its two layers (tanh between, softmax after, the model
// floor on choice 0), every choice's softmax or ReLU read-out as one weight per neighbour
// (adaptive.prefix_mixture's sums), mixed in place. ``distances`` (M, k_max) nearest first; w1
// (hidden, 2 k_max), b1, w2 (J, hidden), b2 the network's layers; ``last`` (J - 1,) each choice's
// last neighbour. Returns (rows whose best token the neighbours changed, rows with kNN mass).
std::vector<int64_t> mix_adaptive(torch::Tensor lprobs, torch::Tensor rows, torch::Tensor distances,
                                  torch::Tensor values, torch::Tensor top, torch::Tensor w1, torch::Tensor b1,
                                  torch::Tensor w2, torch::Tensor b2, torch::Tensor last, double scale, bool relu,
                                  double temperature, double radius, double floor) {
  distances = distances.contiguous();
  values = values.contiguous();
  w1 = w1.contiguous();
  w2 = w2.contiguous();
  const int64_t m = distances.size(0), k = distances.size(1), vocab = lprobs.size(1);
  const int64_t hidden = w1.size(0), choices = w2.size(0);
  check_rows(lprobs, rows, m, "mix_adaptive");
  TORCH_CHECK(w1.size(1) == 2 * k && b1.numel() == hidden && w2.size(1) == hidden && b2.numel() == choices &&
                  last.numel() == choices - 1 && values.size(0) == m && values.size(1) == k && top.numel() == m,
              "mix_adaptive: the network's layers do not fit ", k, " neighbours");
  float* lp = lprobs.data_ptr<float>();
  const int64_t* row = rows.data_ptr<int64_t>();
  const float* dist = distances.data_ptr<float>();
  const int64_t* v = values.data_ptr<int64_t>();
  const float* best = top.data_ptr<float>();
  const float* W1 = w1.data_ptr<float>();
  const float* B1 = b1.data_ptr<float>();
  const float* W2 = w2.data_ptr<float>();
  const float* B2 = b2.data_ptr<float>();
  const int64_t* at_last = last.data_ptr<int64_t>();
  std::vector<int64_t> changed(m, 0), with_mass(m, 0);
  at::parallel_for(0, m, 8, [&](int64_t begin, int64_t end) {
    MixScratch scratch(vocab);
    std::vector<float> feature(2 * k), h(hidden), choice(choices), base(k), cumulative(k), coefficient(k), w(k);
    for (int64_t i = begin; i < end; ++i) {
      const float* d = dist + i * k;
      const int64_t* vi = v + i * k;
      int64_t distinct = 0;
      for (int64_t j = 0; j < k; ++j) {
        float x = d[j] / static_cast<float>(scale);
        feature[j] = std::isnan(x) ? 0.f : std::min(x, 1e3f);  // nan_to_num(posinf=1e3), then capped
        bool fresh = vi[j] >= 0;
        for (int64_t l = 0; l < j && fresh; ++l) fresh = vi[l] != vi[j];
        distinct += fresh;
        feature[k + j] = static_cast<float>(distinct);
      }
      for (int64_t o = 0; o < hidden; ++o) {
        float acc = B1[o];
        for (int64_t j = 0; j < 2 * k; ++j) acc += W1[o * 2 * k + j] * feature[j];
        h[o] = std::tanh(acc);
      }
      float top_logit = -kInf;
      for (int64_t c = 0; c < choices; ++c) {
        float acc = B2[c];
        for (int64_t o = 0; o < hidden; ++o) acc += W2[c * hidden + o] * h[o];
        choice[c] = acc;
        top_logit = std::max(top_logit, acc);
      }
      float sum = 0.f;
      for (int64_t c = 0; c < choices; ++c) sum += (choice[c] = std::exp(choice[c] - top_logit));
      for (int64_t c = 0; c < choices; ++c) choice[c] = (1.f - static_cast<float>(floor)) * choice[c] / sum;
      choice[0] += static_cast<float>(floor);
      float mass;
      if (relu) {
        for (int64_t j = 0; j < k; ++j) base[j] = std::max(1.f - d[j] / static_cast<float>(radius), 0.f);
        mass = base[0];
      } else {
        const bool any = std::isfinite(d[0]);
        for (int64_t j = 0; j < k; ++j) {
          base[j] = any && std::isfinite(d[j]) ? std::exp((d[0] - d[j]) / static_cast<float>(temperature)) : 0.f;
        }
        mass = any ? 1.f : 0.f;
      }
      float running = 0.f;
      for (int64_t j = 0; j < k; ++j) cumulative[j] = (running += base[j]);
      std::fill(coefficient.begin(), coefficient.end(), 0.f);
      float model_share = choice[0], knn_share = 0.f;
      for (int64_t c = 1; c < choices; ++c) {
        const int64_t l = std::min<int64_t>(at_last[c - 1], k - 1);
        const float taken = choice[c] * mass;
        const float total = cumulative[l];
        coefficient[l] += total > 0.f ? taken / total : 0.f;
        model_share += choice[c] - taken;
        knn_share += taken;
      }
      float reach = 0.f;  // neighbour j's weight: base_j times the coefficients of the choices reading it
      for (int64_t j = k - 1; j >= 0; --j) {
        reach += coefficient[j];
        w[j] = base[j] * reach;
      }
      with_mass[i] = knn_share > 0.f;
      changed[i] = mix_row(lp + row[i] * vocab, vocab, w.data(), vi, k, model_share, best[i], scratch);
    }
  });
  return {std::accumulate(changed.begin(), changed.end(), int64_t{0}),
          std::accumulate(with_mass.begin(), with_mass.end(), int64_t{0})};
}

// x = exp(x) in place for a float32 tensor of x <= 0, through the loops the read-outs use (the
// tests compare the vector and the portable ones, RELUFORMER_NO_AVX2=1, with torch.exp)
torch::Tensor exp_nonpositive_(torch::Tensor x) {
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat, "exp_nonpositive_: a contiguous float32 tensor");
  reluformer::exp_nonpositive_inplace(x.data_ptr<float>(), x.numel());
  return x;
}

// Which loops the search and the read-outs run on this CPU (the translation summary names them)
std::string cpu_loops() { return reluformer::has_avx2() ? "AVX2" : "portable"; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cpu_loops", &cpu_loops, "the loops the kNN step runs on this CPU: AVX2 or portable");
  m.def("exp_nonpositive_", &exp_nonpositive_, "exp(x) in place for x <= 0, the read-outs' loops (CPU)");
  m.def("unit_neighbours", &unit_neighbours, "each row's nearest entries in its own unit of keys (CPU)");
  m.def("mix_votes", &mix_votes, "neighbours' shares mixed into log-probabilities in place, and the rows they decided (CPU)");
  m.def("mix_adaptive", &mix_adaptive, "adaptive kNN-MT's Meta-k network and mixture in place (CPU)");
  m.def("mix_readout", &mix_readout, "a softmax or ReLU read-out of the neighbours mixed in place (CPU)");
}
