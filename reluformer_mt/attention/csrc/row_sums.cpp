// Backward of ReLUFormer's row sums over the weights a (N, T, S) of a short ReLU attention call
// (Shen et al. 2023, arXiv:2302.06461): m_i = sum_j a_ij and e_i = sum_j a_ij log max(a_ij, 1e-30).
//
// The gradient is the one autograd gives the PyTorch ops that compute them forward (sum, and
// vecdot of a with log(clamp_min(a, 1e-30))), term by term and summed in autograd's order:
//     da_ij = (g_e,i * l_ij + [a_ij >= 1e-30] (g_e,i * a_ij) / c_ij) + g_m,i
// with l = log c and c = max(a, 1e-30): the same IEEE operations on the same values, so the
// same bits, in one pass instead of autograd's eight over T x S tensors. Built without fast-math
// and for the baseline x86-64 ISA (no fused multiply-add): every product and sum rounds alone.
#include <torch/extension.h>
#include <ATen/Parallel.h>

template <typename scalar_t>
static void row_sums_backward_kernel(const scalar_t* a, const scalar_t* l, const scalar_t* g_mass,
                                     const scalar_t* g_xlogx, scalar_t* out, int64_t rows, int64_t S) {
  const scalar_t lo = static_cast<scalar_t>(1e-30);  // the scalar of clamp_min and of its backward's test
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t ge = g_xlogx ? g_xlogx[r] : scalar_t(0);
      const scalar_t gm = g_mass ? g_mass[r] : scalar_t(0);
      const scalar_t* ar = a + r * S;
      const scalar_t* lr = l + r * S;
      scalar_t* o = out + r * S;
      for (int64_t j = 0; j < S; ++j) {
        const scalar_t x = ar[j];
        scalar_t grad;
        if (g_xlogx) {
          const scalar_t c = x < lo ? lo : x;  // clamp_min; NaN stays NaN as there
          const scalar_t t_x = ge * lr[j];
          const scalar_t t_y = x >= lo ? (ge * x) / c : scalar_t(0);
          grad = t_x + t_y;
          if (g_mass) grad = grad + gm;
        } else {
          grad = gm;
        }
        o[j] = grad;
      }
    }
  });
}

// a, log_c (N, T, S) contiguous; g_mass, g_xlogx (N, T) or empty (no gradient). Returns da.
at::Tensor row_sums_backward(const at::Tensor& a, const at::Tensor& log_c, const at::Tensor& g_mass_,
                             const at::Tensor& g_xlogx_) {
  TORCH_CHECK(a.is_contiguous() && log_c.is_contiguous(), "row_sums_backward: contiguous a and log_c expected");
  auto g_mass = g_mass_.numel() ? g_mass_.contiguous() : g_mass_;
  auto g_xlogx = g_xlogx_.numel() ? g_xlogx_.contiguous() : g_xlogx_;
  auto out = at::empty_like(a);
  const int64_t S = a.size(-1), rows = a.numel() / std::max<int64_t>(S, 1);
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "row_sums_backward", [&] {
    row_sums_backward_kernel<scalar_t>(a.data_ptr<scalar_t>(), log_c.data_ptr<scalar_t>(),
                                       g_mass.numel() ? g_mass.data_ptr<scalar_t>() : nullptr,
                                       g_xlogx.numel() ? g_xlogx.data_ptr<scalar_t>() : nullptr,
                                       out.data_ptr<scalar_t>(), rows, S);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("backward", &row_sums_backward, "gradient of ReLUFormer's row sums (CPU)");
}
