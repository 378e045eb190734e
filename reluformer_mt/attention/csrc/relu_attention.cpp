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

// 0: no visible key in the tile (skip it), 1: all visible (no mask pass), 2: mixed
int tile_kind(const bool* keep, int64_t S, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (keep == nullptr) return 1;
  bool any = false, all = true;
  for (int64_t i = i0; i < i1; ++i) {
    const bool* row = keep + i * S;
    for (int64_t j = j0; j < j1; ++j) {
      any |= row[j];
      all &= row[j];
    }
    if (any && !all) return 2;
  }
  return any ? (all ? 1 : 2) : 0;
}

const bool* mask_of(const at::Tensor& keep, int64_t n, int64_t heads, int64_t T, int64_t S) {
  if (!keep.defined() || keep.numel() == 0) return nullptr;
  int64_t b = keep.size(0) == 1 ? 0 : n / heads;
  return keep.data_ptr<bool>() + b * T * S;
}

// a = relu(s) masked, in place over a (rows x cols) tile with leading dimension ld;
// optionally adds the row sums m_i, sum a log a and the non-zero count.
template <typename scalar_t>
void relu_mask_rows(scalar_t* s, int64_t rows, int64_t cols, int64_t ld, const bool* keep, int64_t S,
                    int64_t i0, int64_t j0, scalar_t* mass, scalar_t* xlogx, int64_t* nonzero) {
  for (int64_t r = 0; r < rows; ++r) {
    scalar_t* x = s + r * ld;
    const bool* k = keep ? keep + (i0 + r) * S + j0 : nullptr;
    if (k) {
      for (int64_t c = 0; c < cols; ++c) x[c] = k[c] ? std::max(x[c], scalar_t(0)) : scalar_t(0);
    } else {
      for (int64_t c = 0; c < cols; ++c) x[c] = std::max(x[c], scalar_t(0));
    }
    if (mass) {
      scalar_t m = 0, e = 0;
      int64_t nz = 0;
      for (int64_t c = 0; c < cols; ++c) {
        scalar_t a = x[c];
        m += a;
        if (a > 0) {
          e += a * std::log(std::max(a, scalar_t(kTiny)));
          ++nz;
        }
      }
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
                   scalar_t add, scalar_t g) {
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
  if (g != zero) {
    for (int64_t c = 0; c < cols; ++c)
      if (x[c] > zero) y[c] += g * std::log(std::max(x[c], scalar_t(kTiny)));
  }
}

}  // namespace

// q (N, T, D) scaled and row-factored, k (N, S, D), v (N, S, Dv), keep (B or 1, 1, T, S) bool or
// empty. Returns out (N, T, Dv), and mass, xlogx (N, T), nonzero (N, T) when want_rows.
std::vector<at::Tensor> relu_attention_forward(const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_,
                                               const at::Tensor& keep_, int64_t heads, int64_t block_q,
                                               int64_t block_k, bool want_rows) {
  // detached: the GEMMs run on OpenMP threads, where autograd's thread-local no-grad mode is not set
  auto q = q_.detach().contiguous(), k = k_.detach().contiguous(), v = v_.detach().contiguous();
  auto keep = keep_.numel() ? keep_.contiguous() : keep_;
  const int64_t N = q.size(0), T = q.size(1), S = k.size(1), Dv = v.size(2);
  auto out = at::zeros({N, T, Dv}, q.options());
  auto mass = want_rows ? at::zeros({N, T}, q.options()) : at::zeros({0}, q.options());
  auto xlogx = want_rows ? at::zeros({N, T}, q.options()) : at::zeros({0}, q.options());
  auto nonzero = at::zeros({want_rows ? N : 0, want_rows ? T : 0}, q.options().dtype(at::kLong));
  const int64_t n_iblocks = (T + block_q - 1) / block_q;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "relu_attention_forward", [&] {
    at::parallel_for(0, N * n_iblocks, 1, [&](int64_t begin, int64_t end) {
      auto tile = at::empty({block_q, block_k}, q.options());
      for (int64_t w = begin; w < end; ++w) {
        const int64_t n = w / n_iblocks, i0 = (w % n_iblocks) * block_q, i1 = std::min(T, i0 + block_q);
        const bool* keep_n = mask_of(keep, n, heads, T, S);
        auto qi = q[n].narrow(0, i0, i1 - i0);
        auto oi = out[n].narrow(0, i0, i1 - i0);
        for (int64_t j0 = 0; j0 < S; j0 += block_k) {
          const int64_t j1 = std::min(S, j0 + block_k);
          int kind = tile_kind(keep_n, S, i0, i1, j0, j1);
          if (kind == 0) continue;
          auto s = tile.narrow(0, 0, i1 - i0).narrow(1, 0, j1 - j0);
          at::mm_out(s, qi, k[n].narrow(0, j0, j1 - j0).t());
          relu_mask_rows<scalar_t>(s.data_ptr<scalar_t>(), i1 - i0, j1 - j0, block_k, kind == 2 ? keep_n : nullptr, S,
                                   i0, j0, want_rows ? mass[n].data_ptr<scalar_t>() : nullptr,
                                   want_rows ? xlogx[n].data_ptr<scalar_t>() : nullptr,
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
                                                const at::Tensor& g_mass_, const at::Tensor& g_xlogx_, int64_t heads,
                                                int64_t block_q, int64_t block_k) {
  auto q = q_.detach().contiguous(), k = k_.detach().contiguous(), v = v_.detach().contiguous();
  auto g_out = g_out_.detach().contiguous();
  auto keep = keep_.numel() ? keep_.contiguous() : keep_;
  const int64_t N = q.size(0), T = q.size(1), S = k.size(1);
  const bool has_m = g_mass_.numel() > 0, has_e = g_xlogx_.numel() > 0;
  auto g_mass = has_m ? g_mass_.detach().contiguous() : g_mass_;
  auto g_xlogx = has_e ? g_xlogx_.detach().contiguous() : g_xlogx_;
  auto dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "relu_attention_backward", [&] {
    // one head per task: dk, dv of a head are sums over all its query tiles
    at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
      auto tile_s = at::empty({block_q, block_k}, q.options());
      auto tile_d = at::empty({block_q, block_k}, q.options());
      for (int64_t n = begin; n < end; ++n) {
        const bool* keep_n = mask_of(keep, n, heads, T, S);
        const scalar_t* gm = has_m ? g_mass[n].data_ptr<scalar_t>() : nullptr;
        const scalar_t* ge = has_e ? g_xlogx[n].data_ptr<scalar_t>() : nullptr;
        for (int64_t i0 = 0; i0 < T; i0 += block_q) {
          const int64_t i1 = std::min(T, i0 + block_q), rows = i1 - i0;
          auto qi = q[n].narrow(0, i0, rows), gi = g_out[n].narrow(0, i0, rows), dqi = dq[n].narrow(0, i0, rows);
          for (int64_t j0 = 0; j0 < S; j0 += block_k) {
            const int64_t j1 = std::min(S, j0 + block_k), cols = j1 - j0;
            int kind = tile_kind(keep_n, S, i0, i1, j0, j1);
            if (kind == 0) continue;
            const bool* km = kind == 2 ? keep_n : nullptr;
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
              relu_grad_row<scalar_t>(sp + r * block_k, dp + r * block_k, cols,
                                      km ? km + (i0 + r) * S + j0 : nullptr, add, ge ? ge[i0 + r] : scalar_t(0));
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &relu_attention_forward, "fused ReLU attention, forward (CPU)");
  m.def("backward", &relu_attention_backward, "fused ReLU attention, backward (CPU)");
}
