"""Numerics at the edges: second derivatives on every tiled route (the kernels' backward passes
are not differentiable), the shared visibility memo under ``torch.inference_mode`` and after
in-place rewrites that bump no version counter, and a learned log gamma in float16 and past
its bound. Each against plain autograd on float64 tensors."""
import numpy as np
import pytest
import torch

from reluformer_mt.attention import AttentionConfig, ReluformerAttention
from reluformer_mt.attention import functions as F_attn
from reluformer_mt.attention import fused
from reluformer_mt.attention.blocked import tiled_attention
from reluformer_mt.attention.visibility import Visibility

E, H = 16, 2


def plain_relu_attention(q, k, v, keep, scaling):
    """The reference: a = relu(s q k^T) masked, out = a v, row mass and sum a log a."""
    a = torch.relu(torch.matmul(q * scaling, k.transpose(-1, -2))) * keep
    out = torch.matmul(a, v)
    return out, a.sum(-1), (a * a.clamp_min(1e-30).log()).sum(-1)


def second_derivative(attend, q, k, v):
    """d |dL/dq|^2 / dv and / dk with L = out + mass + sum a log a (a gradient penalty)."""
    out, mass, xlogx = attend(q, k, v)
    loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum() \
        + 0.3 * mass.sum() + 0.2 * xlogx.sum()
    dq, = torch.autograd.grad(loss, q, create_graph=True)
    penalty = (dq ** 2).sum()
    dv, dk = torch.autograd.grad(penalty, (v, k), allow_unused=True)
    return dv, dk


ROUTES = ["direct", "dense", "blocked"] + (["fused"] if fused.available() else [])


@pytest.mark.parametrize("route", ROUTES)
def test_second_derivatives_equal_plain_autograd_on_every_route(route):
    """create_graph=True through the row-sum node (direct), the C++ kernel (fused) and the tiles
    (dense, blocked): the gradient of a gradient penalty equals plain autograd's (on main: None
    or zeros on direct and fused, an error on blocked)."""
    torch.manual_seed(0)
    B, T, S, D = 2, 7, 9, 4
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.float64, requires_grad=True) for n in (T, S, S))
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[1, -3:] = True
    vis = Visibility.from_padding(T, S, kpm)
    keep = vis.dense()

    def kernel(q, k, v):
        out, rows, _ = tiled_attention(q, k, v, vis, route=route, scaling=0.5, want_rows=True, block_q=4, block_k=4)
        return out, rows[0], rows[1]

    got = second_derivative(kernel, q, k, v)
    expected = second_derivative(lambda q, k, v: plain_relu_attention(q, k, v, keep, 0.5), q, k, v)
    for g, e in zip(got, expected):
        assert g is not None and e is not None
        assert e.abs().max() > 0
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_second_derivatives_of_a_row_factor_and_bias_on_the_tiles():
    """Other activations with a row factor and bias (sigmoid attention's, pointwise's) on the
    blocked route: the gradient of the gradient reaches the factor, as plain autograd's does."""
    torch.manual_seed(1)
    B, T, S, D = 1, 5, 6, 3
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.float64, requires_grad=True) for n in (T, S, S))
    c = torch.rand(B, H, T, 1, dtype=torch.float64).add_(0.5).requires_grad_(True)
    b = torch.randn(B, H, T, 1, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(1, 1, T, S, dtype=torch.bool)

    def run(tiled):
        if tiled:
            out, _, _ = tiled_attention(q, k, v, keep, route="blocked", activation="sigmoid", row_factor=c,
                                        row_bias=b, block_q=2, block_k=4)
        else:
            out = torch.matmul(c * torch.sigmoid(torch.matmul(q, k.transpose(-1, -2)) + b), v)
        dq, = torch.autograd.grad(out.pow(2).sum(), q, create_graph=True)
        return torch.autograd.grad(dq.pow(2).sum(), (c, b, v))

    for g, e in zip(run(True), run(False)):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- the visibility memo

def module_output(module, x, kpm, head_weights=False):
    return module(x, x, x, key_padding_mask=kpm, need_weights=head_weights, need_head_weights=head_weights)[0]


@pytest.mark.parametrize("fn,head_weights", [("relu", False), ("softmax", True), ("sparsemax", False)])
def test_inference_mode_with_a_padding_mask(fn, head_weights):
    """torch.inference_mode() with a padding mask, made outside or inside it (on main:
    'Inference tensors do not track version counter.')."""
    torch.manual_seed(3)
    module = ReluformerAttention(E, H, AttentionConfig(fn=fn), self_attention=True).eval()
    module_output = (lambda m, x, kpm: globals()["module_output"](m, x, kpm, head_weights))
    x = torch.randn(6, 2, E)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, -2:] = True
    with torch.no_grad():
        expected = module_output(module, x, kpm)
    with torch.inference_mode():
        got = module_output(module, x, kpm)
        inner = kpm.clone()  # an inference tensor
        got_inner = module_output(module, x, inner)
        module_output(module, x, inner)  # served from the memo
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(got_inner, expected, rtol=0, atol=0)


def rewrites():
    """Ways to change a mask in place that do not bump its version counter."""
    def through_data(kpm):
        kpm.data[0, -3:] = True

    def through_numpy(kpm):
        kpm.numpy()[0, -3:] = True

    return [through_data, through_numpy]


@pytest.mark.parametrize("rewrite", rewrites(), ids=["data", "numpy"])
@pytest.mark.parametrize("fn,head_weights", [("relu", False), ("softmax", True), ("sparsemax", False)])
def test_a_mask_rewritten_without_a_version_bump_is_not_served_stale(rewrite, fn, head_weights):
    """The memo compares the mask's values, not its version (on main: relative errors 0.29, 0.57, 0.36)."""
    torch.manual_seed(4)
    module = ReluformerAttention(E, H, AttentionConfig(fn=fn), self_attention=True).eval()
    x = torch.randn(8, 2, E)
    kpm = torch.zeros(2, 8, dtype=torch.bool)

    def run(mask):
        with torch.no_grad():
            return module(x, x, x, key_padding_mask=mask, need_weights=head_weights,
                          need_head_weights=head_weights)[0]

    run(kpm)
    version = kpm._version
    rewrite(kpm)
    assert kpm._version == version  # the case: nothing told the memo
    torch.testing.assert_close(run(kpm), run(kpm.clone()), rtol=0, atol=0)


def test_a_reused_from_numpy_buffer_is_not_served_stale():
    torch.manual_seed(5)
    module = ReluformerAttention(E, H, AttentionConfig(fn="relu"), self_attention=True).eval()
    x = torch.randn(8, 2, E)
    buffer = np.zeros((2, 8), dtype=bool)
    with torch.no_grad():
        module(x, x, x, key_padding_mask=torch.from_numpy(buffer), need_weights=False)
        buffer[1, -4:] = True
        got = module(x, x, x, key_padding_mask=torch.from_numpy(buffer), need_weights=False)[0]
        expected = module(x, x, x, key_padding_mask=torch.from_numpy(buffer.copy()), need_weights=False)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# ---------------------------------------------------------------- log gamma

@pytest.mark.parametrize("path", ["reference", "dense", "blocked"])
def test_float16_log_gamma_is_bounded_in_the_modules_dtype(path):
    """A .half() module with log gamma far below 0: finite, and equal to the float64 module at the
    float16 bound, log 65504 (on main: NaN from log gamma ~ -12, the bound taken in float32)."""
    def output(log_gamma, dtype):
        torch.manual_seed(0)
        config = AttentionConfig(fn="relu", relu_gamma_mode="head", impl=path, block_size=8, blocked_min_len=10_000)
        module = ReluformerAttention(E, H, config, self_attention=True).to(dtype).eval()
        with torch.no_grad():
            module.log_gamma.fill_(log_gamma)
            x = (torch.randn(10, 2, E) * 0.1).to(dtype)
            return module(x, x, x, need_weights=False)[0]

    bound = F_attn.log_gamma_bound(torch.float16)
    assert bound == pytest.approx(np.log(65504.0))
    out = output(-12.0, torch.float16)
    assert torch.isfinite(out).all()
    expected = output(-bound, torch.float64)  # outputs near 1e3: float16's precision at that scale
    torch.testing.assert_close(out.double(), expected, rtol=2e-2, atol=2e-2 * float(expected.abs().max()))


def test_a_log_gamma_past_its_bound_gets_a_gradient_back():
    """Past the +-30 clamp plain clamp's gradient is 0; a descent step that moves log gamma back
    inwards now gets it, one that would move it further out does not."""
    from reluformer_mt.attention.functions import Params, relu_gamma

    config = AttentionConfig(fn="relu", relu_gamma_mode="head")
    log_gamma = torch.tensor([35.0, -35.0, 1.0], requires_grad=True)
    params = Params(config, {"log_gamma": log_gamma})
    gamma = relu_gamma(params, torch.float32).view(-1)
    assert gamma[0] == torch.tensor(F_attn.LOG_GAMMA_BOUND).exp()
    # the loss wants a smaller gamma (d/dgamma > 0): log gamma 35 comes back, -35 is not pushed out
    grad, = torch.autograd.grad((gamma * torch.tensor([1.0, 1.0, 1.0])).sum(), log_gamma)
    assert grad[0] > 0 and grad[1] == 0 and grad[2] == torch.tensor(1.0).exp()
    gamma = relu_gamma(params, torch.float32).view(-1)
    grad, = torch.autograd.grad(-gamma.sum(), log_gamma)  # wants a larger gamma
    assert grad[0] == 0 and grad[1] < 0
