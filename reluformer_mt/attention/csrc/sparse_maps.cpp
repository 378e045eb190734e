// sparsemax (Martins & Astudillo 2016, arXiv:1602.02068) and 1.5-entmax (Peters, Niculae &
// Martins 2019, arXiv:1905.05702) over the last dimension, forward and backward, one row per task.
//
// Both are p_j = [x_j - tau]_+^(1/(alpha-1)) with sum_j p_j = 1: sparsemax x = z, power 1;
// 1.5-entmax x = z / 2, power 2. The threshold tau is found without sorting the row:
//   * tau >= max_j x_j - 1 (no p_j exceeds 1), so only keys above max - 1 are candidates: in an
//     attention row that is usually a handful of the S keys;
//   * F(t) = sum_j [x_j - t]_+^power - 1 is convex and decreasing, so Newton steps from
//     t = max - 1 (where F >= 0) rise monotonically towards tau without passing it (for
//     sparsemax the Newton step is Michelot's 1986 projection step);
//   * at every step the closed-form root of sum_{j in C} (x_j - t)^power = 1 over the current
//     set C = {x_j > t} is tried; it is tau exactly when every member of C stays above it.
// So the result is exact (the same support and threshold as a full sort) and each row costs two
// passes over S plus a few passes over its candidates. Accumulation is in double.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int kMaxSteps = 100;  // Newton steps before the current threshold is accepted

// The threshold of one row x (already scaled; hidden keys -inf, at least one finite) whose
// largest value is top, with a scratch buffer of the row's length.
double row_threshold(const double* x, int64_t n, double top, bool squared, std::vector<double>& candidates) {
  double tau = top - 1.0;
  candidates.clear();
  for (int64_t j = 0; j < n; ++j) {
    if (x[j] > tau) candidates.push_back(x[j]);
  }
  for (int step = 0; step < kMaxSteps; ++step) {
    // sums of d = x - tau over C = {d > 0}; C shrinks as tau rises, so keep only its members
    double s1 = 0.0, s2 = 0.0, smallest = std::numeric_limits<double>::infinity();
    size_t count = 0;
    for (double x : candidates) {
      const double d = x - tau;
      if (d > 0.0) {
        candidates[count++] = x;
        s1 += d;
        s2 += d * d;
        smallest = std::min(smallest, d);
      }
    }
    candidates.resize(count);
    if (count == 0) return tau;  // only by rounding: tau already at the top
    const double c = static_cast<double>(count);
    // the root t of sum_C (d - t)^power = 1 on the side below every d, relative to tau
    double root;
    if (!squared) {
      root = (s1 - 1.0) / c;
    } else {
      const double disc = s1 * s1 - c * (s2 - 1.0);
      root = disc >= 0.0 ? (s1 - std::sqrt(disc)) / c : std::numeric_limits<double>::infinity();
    }
    if (root < smallest) return tau + std::max(root, 0.0);  // every member of C in the support: exact
    // Newton step on F (never past tau): F = sum d^power - 1, F' = -power * sum d^(power - 1)
    const double newton = squared ? (s2 - 1.0) / (2.0 * s1) : (s1 - 1.0) / c;
    if (!(newton > 0.0)) return tau;  // converged to rounding
    tau += newton;
  }
  return tau;
}

// keep: empty (every key visible) or a bool tensor of 4 dimensions (B or 1, H or 1, T, S)
// broadcasting against logits (B, H, T, S); hidden keys get p = 0, a row without a visible key is 0.
at::Tensor forward(const at::Tensor& logits, const at::Tensor& keep, double alpha) {
  TORCH_CHECK(alpha == 2.0 || alpha == 1.5, "sparse_maps: alpha must be 2 (sparsemax) or 1.5 (entmax15)");
  TORCH_CHECK(logits.device().is_cpu(), "sparse_maps: CPU tensors only");
  const at::Tensor z = logits.contiguous();
  const bool masked = keep.defined() && keep.numel() > 0;
  at::Tensor k = masked ? keep.contiguous() : keep;
  if (masked) {
    TORCH_CHECK(z.dim() == 4 && k.dim() == 4 && k.scalar_type() == at::kBool && k.size(2) == z.size(2) &&
                    k.size(3) == z.size(3) && (k.size(0) == 1 || k.size(0) == z.size(0)) &&
                    (k.size(1) == 1 || k.size(1) == z.size(1)),
                "sparse_maps: keep must be a bool (B|1, H|1, T, S) mask for logits (B, H, T, S)");
  }
  at::Tensor p = at::empty_like(z);
  const int64_t n = z.size(-1), rows = n == 0 ? 0 : z.numel() / n;
  const int64_t T = masked ? z.size(2) : 1, H = masked ? z.size(1) : 1;
  const bool keep_b = masked && k.size(0) > 1, keep_h = masked && k.size(1) > 1;
  const bool* keep_data = masked ? k.data_ptr<bool>() : nullptr;
  const bool squared = alpha == 1.5;
  const double scale = squared ? 0.5 : 1.0;
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "sparse_maps_forward", [&] {
    const scalar_t* zp = z.data_ptr<scalar_t>();
    scalar_t* pp = p.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      std::vector<double> candidates, row(n);
      candidates.reserve(n);
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* z_row = zp + r * n;
        scalar_t* out = pp + r * n;
        const bool* visible = nullptr;
        if (masked) {  // row r = (b * H + h) * T + t of the logits -> the same (b, h, t) of keep
          const int64_t t = r % T, h = (r / T) % H, b = r / (T * H);
          visible = keep_data + (((keep_b ? b : 0) * (keep_h ? H : 1) + (keep_h ? h : 0)) * T + t) * n;
        }
        // hidden keys take -inf: never candidates, and p = [x - tau]_+ = 0 there
        constexpr double hidden = -std::numeric_limits<double>::infinity();
        double top = hidden;
        if (visible == nullptr) {
          for (int64_t j = 0; j < n; ++j) {
            row[j] = scale * static_cast<double>(z_row[j]);
            top = std::max(top, row[j]);
          }
        } else {
          for (int64_t j = 0; j < n; ++j) {
            row[j] = visible[j] ? scale * static_cast<double>(z_row[j]) : hidden;
            top = std::max(top, row[j]);
          }
        }
        if (top == hidden) {  // no visible key
          std::fill(out, out + n, scalar_t(0));
          continue;
        }
        const double tau = row_threshold(row.data(), n, top, squared, candidates);
        for (int64_t j = 0; j < n; ++j) {
          const double d = std::max(row[j] - tau, 0.0);
          out[j] = static_cast<scalar_t>(squared ? d * d : d);
        }
      }
    });
  });
  return p;
}

// d loss / d z from p and d loss / d p. sparsemax: on the support g_j - mean_support(g), else 0.
// 1.5-entmax: s_j (g_j - sum(s g) / sum(s)) with s = sqrt(p) = d p_j / d z_j (the chain rule's
// 1/2 of x = z/2 included).
at::Tensor backward(const at::Tensor& probs, const at::Tensor& grad, double alpha) {
  TORCH_CHECK(alpha == 2.0 || alpha == 1.5, "sparse_maps: alpha must be 2 (sparsemax) or 1.5 (entmax15)");
  const at::Tensor p = probs.contiguous(), g = grad.contiguous().to(p.scalar_type());
  at::Tensor dz = at::empty_like(p);
  const int64_t n = p.size(-1), rows = n == 0 ? 0 : p.numel() / n;
  const bool squared = alpha == 1.5;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "sparse_maps_backward", [&] {
    const scalar_t* pp = p.data_ptr<scalar_t>();
    const scalar_t* gp = g.data_ptr<scalar_t>();
    scalar_t* dp = dz.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* pr = pp + r * n;
        const scalar_t* gr = gp + r * n;
        scalar_t* dr = dp + r * n;
        double weight_sum = 0.0, weighted_grad = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          if (pr[j] > 0) {
            const double s = squared ? std::sqrt(static_cast<double>(pr[j])) : 1.0;
            weight_sum += s;
            weighted_grad += s * static_cast<double>(gr[j]);
          }
        }
        const double mean = weight_sum > 0.0 ? weighted_grad / weight_sum : 0.0;
        for (int64_t j = 0; j < n; ++j) {
          if (pr[j] > 0) {
            const double s = squared ? std::sqrt(static_cast<double>(pr[j])) : 1.0;
            dr[j] = static_cast<scalar_t>(s * (static_cast<double>(gr[j]) - mean));
          } else {
            dr[j] = 0;
          }
        }
      }
    });
  });
  return dz;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "sparsemax (alpha 2) / 1.5-entmax (alpha 1.5) over the last dimension, hidden keys 0");
  m.def("backward", &backward, "their gradient from the output and the output's gradient");
}
