// Fused CPU kernel for ReLU attention: out_i = sum_j relu(q_i . k_j) [key j visible] v_j.
//
// The caller folds the logit scale and the positive row factor c_i into q (c_i relu(s) =
// relu(c_i s)), so one kernel serves ReLUFormer (Shen et al. 2023, arXiv:2302.06461), ReLA
// (Zhang et al. 2021, arXiv:2104.07012) and pointwise attention with h = relu.
//
// Work is split into tiles of block_q queries x block_k keys of ONE head, small enough to stay
// in the L2 cache. Each tile costs two GEMMs (ATen's, i.e. MKL/BLAS) forward and five backward;
// ReLU, mask and the regularisers' row sums are applied in one pass over the tile between them,
// instead of the several full passes over (heads x tile) tensors of the PyTorch blocked path.
// Nothing of size T x S is kept: the backward recomputes the logits tile by tile.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr double kTiny = 1e-30;  // log stand-in at a = 0 (as blocked._safe_log), so a log a = 0

// Which keys query i of head n sees. Either key ranges (start_b <= j < end_b, and j <= i + offset
// when causal: every mask fairseq builds for translation, O(B) memory) or, for other patterns, a
// (B or 1, 1, T, S) bool mask. See reluformer_mt/attention/visibility.py.
struct Visible {
  const bool* mask = nullptr;  // the mask of this batch row, or null
  int64_t S = 0, start = 0, end = 0, offset = 0;
  bool ranged = false, causal = false;

  // [lo, hi) of the keys query i sees (ranged mode)
  int64_t lo() const { return start; }
  int64_t hi(int64_t i) const { return causal ? std::min(end, i + offset + 1) : end; }

  // 0: no visible key in the tile (skip it), 1: all visible (no mask pass), 2: mixed
  int tile_kind(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    if (ranged) {
      if (std::max(lo(), j0) >= std::min(hi(i1 - 1), j1)) return 0;
      return (lo() <= j0 && hi(i0) >= j1) ? 1 : 2;
    }
    if (mask == nullptr) return 1;
    bool any = false, all = true;
    for (int64_t i = i0; i < i1; ++i) {
      const bool* row = mask + i * S;
      for (int64_t j = j0; j < j1; ++j) {
        any |= row[j];
        all &= row[j];
      }
      if (any && !all) return 2;
    }
    return any ? (all ? 1 : 2) : 0;
  }
};

// Visibility of head n: batch row b = n / heads of the ranges or the mask.
Visible visible_of(const at::Tensor& keep, const at::Tensor& starts, const at::Tensor& ends, bool causal,
                   int64_t offset, int64_t n, int64_t heads, int64_t T, int64_t S) {
  Visible v;
  v.S = S;
  if (keep.defined() && keep.numel() > 0) {
    int64_t b = keep.size(0) == 1 ? 0 : n / heads;
    v.mask = keep.data_ptr<bool>() + b * T * S;
    return v;
  }
  v.ranged = true;
  v.causal = causal;
  v.offset = offset;
  v.start = 0;
  v.end = S;
  if (starts.numel() > 0) {
    int64_t b = starts.numel() == 1 ? 0 : n / heads;
    v.start = starts.data_ptr<int64_t>()[b];
    v.end = ends.data_ptr<int64_t>()[b];
  }
  return v;
}

// Columns [a, b) of tile row i (absolute) that are visible, relative to the tile's first key j0;
// only for ranged visibility. The mask form is handled by the callers.
inline void visible_columns(const Visible& vis, int64_t i, int64_t j0, int64_t cols, int64_t* a, int64_t* b) {
  *a = std::clamp(vis.lo() - j0, int64_t(0), cols);
  *b = std::clamp(vis.hi(i) - j0, *a, cols);
}

// a = relu(s) masked, in place over a (rows x cols) tile with leading dimension ld;
// optionally adds the non-zero count and (with mass and xlogx) the row sums m_i and sum a log a.
template <typename scalar_t>
void relu_mask_rows(scalar_t* s, int64_t rows, int64_t cols, int64_t ld, const Visible* vis,
                    int64_t i0, int64_t j0, scalar_t* mass, scalar_t* xlogx, int64_t* nonzero) {
  std::vector<scalar_t> scratch(mass ? cols : 0);
  for (int64_t r = 0; r < rows; ++r) {
    scalar_t* x = s + r * ld;
    const bool* k = (vis && vis->mask) ? vis->mask + (i0 + r) * vis->S + j0 : nullptr;
    if (vis && vis->ranged) {  // zero the hidden columns at both ends, ReLU between
      int64_t a, b;
      visible_columns(*vis, i0 + r, j0, cols, &a, &b);
      std::fill(x, x + a, scalar_t(0));
      std::fill(x + b, x + cols, scalar_t(0));
      for (int64_t c = a; c < b; ++c) x[c] = std::max(x[c], scalar_t(0));
    } else if (k) {
      for (int64_t c = 0; c < cols; ++c) x[c] = k[c] ? std::max(x[c], scalar_t(0)) : scalar_t(0);
    } else {
      for (int64_t c = 0; c < cols; ++c) x[c] = std::max(x[c], scalar_t(0));
    }
    if (nonzero && !mass) {  // counts only (statistics without regularisers): no log per weight
      int64_t nz = 0;
      for (int64_t c = 0; c < cols; ++c) nz += x[c] > scalar_t(0);
      nonzero[i0 + r] += nz;
    } else if (mass) {
      // the positive weights first (branch-free), then their a log a in the same order: with about
      // half the weights zero, a branch per weight mispredicted about as often as it was taken
      scalar_t m = 0, e = 0;
      int64_t nz = 0;
      scalar_t* positive = scratch.data();
      for (int64_t c = 0; c < cols; ++c) {
        const scalar_t a = x[c];
        m += a;
        positive[nz] = a;
        nz += a > scalar_t(0);
      }
      for (int64_t p = 0; p < nz; ++p) e += positive[p] * std::log(std::max(positive[p], scalar_t(kTiny)));
      mass[i0 + r] += m;
      xlogx[i0 + r] += e;
      nonzero[i0 + r] += nz;
    }
  }
}

// One row of the backward tile, branch-free so that it vectorises: x <- a = relu(x) masked,
// y <- [a > 0] (y + add + g log a). x and y never overlap.
template <typename scalar_t>
void relu_grad_row(scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t cols, const bool* __restrict__ keep,
                   scalar_t add, scalar_t g, int64_t* __restrict__ positive) {
  const scalar_t zero(0);
  if (keep) {
    for (int64_t c = 0; c < cols; ++c) {
      const scalar_t a = keep[c] ? std::max(x[c], zero) : zero;
      x[c] = a;
      const scalar_t t = y[c] + add;  // unconditional, so the select vectorises
      y[c] = a > zero ? t : zero;
    }
  } else {
    for (int64_t c = 0; c < cols; ++c) {
      const scalar_t a = std::max(x[c], zero);
      x[c] = a;
      const scalar_t t = y[c] + add;  // unconditional, so the select vectorises
      y[c] = a > zero ? t : zero;
    }
  }
  if (g != zero) {  // the positive columns first (branch-free), then their log terms
    int64_t n = 0;
    for (int64_t c = 0; c < cols; ++c) {
      positive[n] = c;
      n += x[c] > zero;
    }
    for (int64_t p = 0; p < n; ++p) {
      const int64_t c = positive[p];
      y[c] += g * std::log(std::max(x[c], scalar_t(kTiny)));
    }
  }
}

// A padding mask given with its range check ``hold`` (a bool read here from the CPU tensor, not asked
// for on the host before the call: issue 64): where padding has a hole, its dense keep mask (causal
// folded in) replaces the ranges. See Visibility.kernel_range_check in visibility.py.
void resolve_padding(const at::Tensor& hold, const at::Tensor& padding, int64_t T, int64_t S, int64_t offset,
                     at::Tensor& keep, at::Tensor& starts, at::Tensor& ends, bool& causal) {
  if (hold.numel() == 0 || hold.contiguous().data_ptr<bool>()[0]) return;
  const int64_t B = padding.size(0);
  auto visible = padding.logical_not().view({B, 1, 1, S}).expand({B, 1, T, S});
  if (causal) {
    auto rows = at::arange(T, padding.options().dtype(at::kLong)).view({1, 1, T, 1});
    auto cols = at::arange(S, padding.options().dtype(at::kLong)).view({1, 1, 1, S});
    visible = visible.logical_and(cols.le(rows + offset));
  }
  keep = visible.contiguous();
  starts = at::empty({0}, padding.options().dtype(at::kLong));
  ends = starts;
  causal = false;
}

}  // namespace

// q (N, T, D) scaled and row-factored, k (N, S, D), v (N, S, Dv); visibility: keep (B or 1, 1, T, S)
// bool, or (when keep is empty) key ranges starts / ends (B,) int64 (empty: all keys) and, when
// causal, j <= i + offset; hold / padding (or empty): the ranges' check and the padding mask they
// came from (resolve_padding). Returns out (N, T, Dv), and nonzero (N, T) when want_rows, with mass and
// xlogx (N, T) when also row_sums (else those two are empty).
std::vector<at::Tensor> relu_attention_forward(const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_,
                                               const at::Tensor& keep_, const at::Tensor& starts_,
                                               const at::Tensor& ends_, bool causal, int64_t offset, const at::Tensor& hold,
                                               const at::Tensor& padding, int64_t heads, int64_t block_q,
                                               int64_t block_k, bool want_rows, bool row_sums) {
  // detached: the GEMMs run on OpenMP threads, where autograd's thread-local no-grad mode is not set
  auto q = q_.detach().contiguous(), k = k_.detach().contiguous(), v = v_.detach().contiguous();
  auto keep = keep_.numel() ? keep_.contiguous() : keep_;
  auto starts = starts_.numel() ? starts_.to(at::kLong).contiguous() : starts_;
  auto ends = ends_.numel() ? ends_.to(at::kLong).contiguous() : ends_;
  const int64_t N = q.size(0), T = q.size(1), S = k.size(1), Dv = v.size(2);
  resolve_padding(hold, padding, T, S, offset, keep, starts, ends, causal);
  auto out = at::zeros({N, T, Dv}, q.options());
  const bool sums = want_rows && row_sums;
  auto mass = sums ? at::zeros({N, T}, q.options()) : at::zeros({0}, q.options());
  auto xlogx = sums ? at::zeros({N, T}, q.options()) : at::zeros({0}, q.options());
  auto nonzero = at::zeros({want_rows ? N : 0, want_rows ? T : 0}, q.options().dtype(at::kLong));
  const int64_t n_iblocks = (T + block_q - 1) / block_q;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "relu_attention_forward", [&] {
    at::parallel_for(0, N * n_iblocks, 1, [&](int64_t begin, int64_t end) {
      auto tile = at::empty({block_q, block_k}, q.options());
      for (int64_t w = begin; w < end; ++w) {
        const int64_t n = w / n_iblocks, i0 = (w % n_iblocks) * block_q, i1 = std::min(T, i0 + block_q);
        const Visible vis = visible_of(keep, starts, ends, causal, offset, n, heads, T, S);
        auto qi = q[n].narrow(0, i0, i1 - i0);
        auto oi = out[n].narrow(0, i0, i1 - i0);
        for (int64_t j0 = 0; j0 < S; j0 += block_k) {
          const int64_t j1 = std::min(S, j0 + block_k);
          int kind = vis.tile_kind(i0, i1, j0, j1);
          if (kind == 0) continue;
          auto s = tile.narrow(0, 0, i1 - i0).narrow(1, 0, j1 - j0);
          at::mm_out(s, qi, k[n].narrow(0, j0, j1 - j0).t());
          relu_mask_rows<scalar_t>(s.data_ptr<scalar_t>(), i1 - i0, j1 - j0, block_k, kind == 2 ? &vis : nullptr,
                                   i0, j0, sums ? mass[n].data_ptr<scalar_t>() : nullptr,
                                   sums ? xlogx[n].data_ptr<scalar_t>() : nullptr,
                                   want_rows ? nonzero[n].data_ptr<int64_t>() : nullptr);
          oi.addmm_(s, v[n].narrow(0, j0, j1 - j0));
        }
      }
    });
  });
  return {out, mass, xlogx, nonzero};
}

// Gradients of relu_attention_forward: recomputes each tile's weights; g_mass / g_xlogx (N, T)
// may be empty. d a_ij gets g_out_i . v_j + g_mass_i + g_xlogx_i (log a_ij + 1), cut where a_ij = 0.
std::vector<at::Tensor> relu_attention_backward(const at::Tensor& g_out_, const at::Tensor& q_, const at::Tensor& k_,
                                                const at::Tensor& v_, const at::Tensor& keep_,
                                                const at::Tensor& starts_, const at::Tensor& ends_, bool causal,
                                                int64_t offset, const at::Tensor& hold, const at::Tensor& padding,
                                                const at::Tensor& g_mass_, const at::Tensor& g_xlogx_, int64_t heads,
                                                int64_t block_q, int64_t block_k) {
  auto q = q_.detach().contiguous(), k = k_.detach().contiguous(), v = v_.detach().contiguous();
  auto g_out = g_out_.detach().contiguous();
  auto keep = keep_.numel() ? keep_.contiguous() : keep_;
  auto starts = starts_.numel() ? starts_.to(at::kLong).contiguous() : starts_;
  auto ends = ends_.numel() ? ends_.to(at::kLong).contiguous() : ends_;
  const int64_t N = q.size(0), T = q.size(1), S = k.size(1);
  resolve_padding(hold, padding, T, S, offset, keep, starts, ends, causal);
  const bool has_m = g_mass_.numel() > 0, has_e = g_xlogx_.numel() > 0;
  auto g_mass = has_m ? g_mass_.detach().contiguous() : g_mass_;
  auto g_xlogx = has_e ? g_xlogx_.detach().contiguous() : g_xlogx_;
  auto dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "relu_attention_backward", [&] {
    // one head per task: dk, dv of a head are sums over all its query tiles
    at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
      auto tile_s = at::empty({block_q, block_k}, q.options());
      auto tile_d = at::empty({block_q, block_k}, q.options());
      std::vector<int64_t> positive(block_k);  // relu_grad_row's scratch
      for (int64_t n = begin; n < end; ++n) {
        const Visible vis = visible_of(keep, starts, ends, causal, offset, n, heads, T, S);
        const scalar_t* gm = has_m ? g_mass[n].data_ptr<scalar_t>() : nullptr;
        const scalar_t* ge = has_e ? g_xlogx[n].data_ptr<scalar_t>() : nullptr;
        for (int64_t i0 = 0; i0 < T; i0 += block_q) {
          const int64_t i1 = std::min(T, i0 + block_q), rows = i1 - i0;
          auto qi = q[n].narrow(0, i0, rows), gi = g_out[n].narrow(0, i0, rows), dqi = dq[n].narrow(0, i0, rows);
          for (int64_t j0 = 0; j0 < S; j0 += block_k) {
            const int64_t j1 = std::min(S, j0 + block_k), cols = j1 - j0;
            int kind = vis.tile_kind(i0, i1, j0, j1);
            if (kind == 0) continue;
            const bool* km = (kind == 2 && vis.mask) ? vis.mask : nullptr;
            const bool ranged = kind == 2 && vis.ranged;
            auto kj = k[n].narrow(0, j0, cols), vj = v[n].narrow(0, j0, cols);
            auto s = tile_s.narrow(0, 0, rows).narrow(1, 0, cols);
            auto d = tile_d.narrow(0, 0, rows).narrow(1, 0, cols);
            at::mm_out(s, qi, kj.t());
            at::mm_out(d, gi, vj.t());
            scalar_t* sp = s.data_ptr<scalar_t>();
            scalar_t* dp = d.data_ptr<scalar_t>();
            // one pass: a = relu(s) masked (into s), ds = [a > 0] (da + row terms) (into d)
            for (int64_t r = 0; r < rows; ++r) {
              const scalar_t add = (gm ? gm[i0 + r] : scalar_t(0)) + (ge ? ge[i0 + r] : scalar_t(0));
              scalar_t* x = sp + r * block_k;
              scalar_t* y = dp + r * block_k;
              const scalar_t g = ge ? ge[i0 + r] : scalar_t(0);
              if (ranged) {  // hidden columns at both ends: a = 0 and no gradient there
                int64_t a, b;
                visible_columns(vis, i0 + r, j0, cols, &a, &b);
                std::fill(x, x + a, scalar_t(0));
                std::fill(y, y + a, scalar_t(0));
                std::fill(x + b, x + cols, scalar_t(0));
                std::fill(y + b, y + cols, scalar_t(0));
                relu_grad_row<scalar_t>(x + a, y + a, b - a, nullptr, add, g, positive.data());
              } else {
                relu_grad_row<scalar_t>(x, y, cols, km ? km + (i0 + r) * S + j0 : nullptr, add, g,
                                        positive.data());
              }
            }
            dv[n].narrow(0, j0, cols).addmm_(s.t(), gi);
            dqi.addmm_(d, kj);
            dk[n].narrow(0, j0, cols).addmm_(d.t(), qi);
          }
        }
      }
    });
  });
  return {dq, dk, dv};
}

// Gradient of the logits on the direct route with ReLUFormer's row sums (blocked._DirectReluRows):
// a = relu(s) (N, T, S), out = a v, m_i = a_i.sum() and e_i = vecdot(a_i, l_i) with l = log c,
// c = max(a, 1e-30). Per weight, the terms autograd's nodes give a (sum's g_m; vecdot's g_e l;
// the one through log and clamp_min, [a >= 1e-30] (g_e a) / c; the output GEMM's d_out), summed
// in the order autograd's engine sums them, then cut by ReLU's backward ([a <= 0] -> 0):
//     ds = [a > 0] (((g_m + g_e l) + [a >= 1e-30] (g_e a) / c) + d_out)
// On the CPU the engine runs a graph's nodes in reverse creation order (the latest unfinished
// node is always ready) and sums a tensor's gradient terms as its consumers finish; the forward
// creates the output GEMM, then vecdot, then sum, so whatever graph surrounds the call, this is
// autograd's order, and the same IEEE operations on the same values give the same bits in one
// pass instead of ten. A term whose gradient is absent is left out, as autograd leaves it out.
// The build targets the baseline x86-64 ISA without fast-math: no fused multiply-add.
// In place a = relu(s) on the direct route's logits s (N, T, S), with hidden keys' logits first
// multiplied by 0, and each row's non-zero count: the same bits as s.mul_(keep).relu_() (ReLU keeps
// a signed zero and NaN, and maps x < 0 to +0) and count_nonzero, in one pass instead of four.
template <typename scalar_t>
static void relu_count_rows(scalar_t* s, const bool* keep, int64_t keep_batch, int64_t kb, int64_t kt,
                            int64_t* nonzero, int64_t N, int64_t T, int64_t S, int64_t heads) {
  const scalar_t zero(0);
  at::parallel_for(0, N * T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      scalar_t* x = s + r * S;
      const int64_t n = r / T, i = r % T;
      int64_t nz = 0;
      if (keep) {
        const bool* k = keep + (keep_batch == 1 ? 0 : n / heads) * kb + i * kt;
        for (int64_t j = 0; j < S; ++j) {
          const scalar_t v = x[j];
          const scalar_t a = k[j] ? (v < zero ? zero : v) : v * zero;
          x[j] = a;
          nz += a != zero;
        }
      } else {
        for (int64_t j = 0; j < S; ++j) {
          const scalar_t v = x[j];
          const scalar_t a = v < zero ? zero : v;
          x[j] = a;
          nz += a != zero;
        }
      }
      nonzero[r] = nz;
    }
  });
}

// s (N, T, S) contiguous float, made a = relu(s) masked in place; keep (B or 1, 1, T, S) bool (rows of
// S contiguous) or empty. Returns the non-zero count of each row, (N, T) int64.
at::Tensor relu_count_(at::Tensor s, const at::Tensor& keep_, int64_t heads) {
  TORCH_CHECK(s.is_contiguous() && s.dim() == 3, "relu_count_: contiguous (N, T, S) logits expected");
  const int64_t N = s.size(0), T = s.size(1), S = s.size(2);
  auto keep = keep_;
  if (keep.numel()) {
    TORCH_CHECK(keep.dim() == 4 && keep.size(2) == T && keep.size(3) == S, "relu_count_: keep (B or 1, 1, T, S) expected");
    if (keep.stride(3) != 1) keep = keep.contiguous();
  }
  auto nonzero = at::empty({N, T}, s.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "relu_count_", [&] {
    relu_count_rows<scalar_t>(s.data_ptr<scalar_t>(), keep.numel() ? keep.data_ptr<bool>() : nullptr,
                              keep.numel() ? keep.size(0) : 1, keep.numel() ? keep.stride(0) : 0,
                              keep.numel() ? keep.stride(2) : 0, nonzero.data_ptr<int64_t>(), N, T, S, heads);
  });
  return nonzero;
}

// One row; which terms exist is a template argument, so that the loop has no branch and
// vectorises (a branch on a > 0 per weight mispredicts about half the time).
template <typename scalar_t, bool kMass, bool kXlogx, bool kOut>
static void direct_relu_grad_row(const scalar_t* __restrict__ a, const scalar_t* __restrict__ l, scalar_t gm,
                                 scalar_t ge, scalar_t* __restrict__ d, int64_t S) {
  const scalar_t lo = static_cast<scalar_t>(kTiny);  // clamp_min's scalar and its backward's test
  const scalar_t zero(0);
  for (int64_t j = 0; j < S; ++j) {
    const scalar_t x = a[j];
    scalar_t acc = zero;
    if (kXlogx) {
      const scalar_t t_vecdot = ge * l[j];
      const scalar_t c = x < lo ? lo : x;
      const scalar_t quotient = (ge * x) / c;  // c >= 1e-30 (or NaN with x): no trap
      const scalar_t t_log = x >= lo ? quotient : zero;
      acc = (kMass ? gm + t_vecdot : t_vecdot) + t_log;
      if (kOut) acc = acc + d[j];
    } else if (kMass) {
      acc = kOut ? gm + d[j] : gm;
    } else {
      acc = d[j];
    }
    d[j] = x <= zero ? zero : acc;
  }
}

template <typename scalar_t, bool kMass, bool kXlogx, bool kOut>
static void direct_relu_grad_rows(const scalar_t* a, const scalar_t* l, const scalar_t* g_mass,
                                  const scalar_t* g_xlogx, scalar_t* d, int64_t rows, int64_t S) {
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      direct_relu_grad_row<scalar_t, kMass, kXlogx, kOut>(a + r * S, l + r * S, kMass ? g_mass[r] : scalar_t(0),
                                                           kXlogx ? g_xlogx[r] : scalar_t(0), d + r * S, S);
  });
}

template <typename scalar_t>
static void direct_relu_grad_kernel(const scalar_t* a, const scalar_t* l, const scalar_t* g_mass,
                                    const scalar_t* g_xlogx, scalar_t* d, bool has_out, int64_t rows, int64_t S) {
  const int which = (g_mass ? 4 : 0) + (g_xlogx ? 2 : 0) + (has_out ? 1 : 0);
  switch (which) {
    case 7: direct_relu_grad_rows<scalar_t, true, true, true>(a, l, g_mass, g_xlogx, d, rows, S); break;
    case 6: direct_relu_grad_rows<scalar_t, true, true, false>(a, l, g_mass, g_xlogx, d, rows, S); break;
    case 5: direct_relu_grad_rows<scalar_t, true, false, true>(a, l, g_mass, g_xlogx, d, rows, S); break;
    case 4: direct_relu_grad_rows<scalar_t, true, false, false>(a, l, g_mass, g_xlogx, d, rows, S); break;
    case 3: direct_relu_grad_rows<scalar_t, false, true, true>(a, l, g_mass, g_xlogx, d, rows, S); break;
    case 2: direct_relu_grad_rows<scalar_t, false, true, false>(a, l, g_mass, g_xlogx, d, rows, S); break;
    default: direct_relu_grad_rows<scalar_t, false, false, true>(a, l, g_mass, g_xlogx, d, rows, S); break;
  }
}

// a, log_c (N, T, S); g_mass, g_xlogx (N, T) or empty (no gradient reached that sum); d_out (N, T, S),
// the output GEMM's gradient of a, or empty. Returns the logits' gradient (in d_out's storage if given).
at::Tensor direct_relu_backward(const at::Tensor& a_, const at::Tensor& log_c_, const at::Tensor& g_mass_,
                                const at::Tensor& g_xlogx_, const at::Tensor& d_out_) {
  auto a = a_.detach().contiguous(), log_c = log_c_.detach().contiguous();
  const bool has_m = g_mass_.numel() > 0, has_e = g_xlogx_.numel() > 0, has_out = d_out_.numel() > 0;
  TORCH_CHECK(has_m || has_e || has_out, "direct_relu_backward: no gradient given");
  auto g_mass = has_m ? g_mass_.detach().to(a.scalar_type()).contiguous() : g_mass_;
  auto g_xlogx = has_e ? g_xlogx_.detach().to(a.scalar_type()).contiguous() : g_xlogx_;
  auto d = has_out ? d_out_.detach().contiguous() : at::empty_like(a);
  TORCH_CHECK(d.sizes() == a.sizes() && d.scalar_type() == a.scalar_type(), "direct_relu_backward: d_out must match a");
  const int64_t S = a.size(-1), rows = S ? a.numel() / S : 0;
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "direct_relu_backward", [&] {
    direct_relu_grad_kernel<scalar_t>(a.data_ptr<scalar_t>(), log_c.data_ptr<scalar_t>(),
                                      has_m ? g_mass.data_ptr<scalar_t>() : nullptr,
                                      has_e ? g_xlogx.data_ptr<scalar_t>() : nullptr, d.data_ptr<scalar_t>(),
                                      has_out, rows, S);
  });
  return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("direct_relu_backward", &direct_relu_backward,
        "gradient of the logits of ReLU attention with row sums, direct route (CPU)");
  m.def("relu_count_", &relu_count_, "in place masked ReLU of the direct route's logits, and row counts (CPU)");
  m.def("forward", &relu_attention_forward, "fused ReLU attention, forward (CPU)");
  m.def("backward", &relu_attention_backward, "fused ReLU attention, backward (CPU)");
}
