"""The sort-free sparsemax / 1.5-entmax kernel equals the ``entmax`` package, values and gradients."""
import pytest
import torch
from entmax import entmax15, sparsemax

from reluformer_mt.attention import sparse_maps
from reluformer_mt.extension import LazyExtension
from reluformer_mt.attention.functions import entmax15_weights, sparsemax_weights

REFERENCE = {"sparsemax": sparsemax, "entmax15": entmax15}
pytestmark = pytest.mark.skipif(sparse_maps.load() is None, reason="C++ kernel not buildable here")


def rows():
    """Flat rows (support of hundreds), peaked rows (support 1-3), ties, a -1e4 masked tail."""
    torch.manual_seed(0)
    flat = torch.randn(4, 300) * 0.01
    peaked = torch.randn(4, 300) * 30.0
    ties = torch.zeros(2, 300)
    ties[0, :7] = 1.0  # seven equal maxima
    masked = torch.randn(2, 300)
    masked[:, 100:] = -1e4
    return torch.cat([flat, peaked, ties, masked, torch.randn(4, 300) * 3.0]).double()


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_kernel_equals_the_entmax_package(name):
    z = rows()
    p = sparse_maps.sparse_map(z, name)
    expected = REFERENCE[name](z, dim=-1)
    torch.testing.assert_close(p, expected, atol=1e-12, rtol=0)
    assert torch.equal(p > 0, expected > 0), "the same support"
    supports = (p > 0).sum(-1)
    assert supports.max() > 200 and supports.min() <= 3  # both regimes were exercised
    f = sparse_maps.sparse_map(z.float(), name)
    torch.testing.assert_close(f, expected.float(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_kernel_gradient(name):
    z = (torch.randn(5, 11, dtype=torch.double) * 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: sparse_maps.sparse_map(x, name), (z,))
    big = rows().requires_grad_()
    reference = big.detach().clone().requires_grad_()
    grad = torch.randn_like(big)
    sparse_maps.sparse_map(big, name).backward(grad)
    REFERENCE[name](reference, dim=-1).backward(grad)
    torch.testing.assert_close(big.grad, reference.grad, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name,function", [("sparsemax", sparsemax_weights), ("entmax15", entmax15_weights)])
def test_attention_weights_take_the_kernel_and_agree_with_the_package(name, function, monkeypatch):
    torch.manual_seed(1)
    scores = torch.randn(2, 4, 9, 13) * 3
    keep = torch.ones(2, 1, 9, 13, dtype=torch.bool)
    keep[1, :, :, 10:] = False  # padding of the second sentence
    keep[0, :, 3] = False  # a query row without a visible key
    calls = []
    original = sparse_maps.sparse_map
    monkeypatch.setattr(sparse_maps, "sparse_map", lambda x, n, keep=None: calls.append(n) or original(x, n, keep))
    with_kernel = function(scores, keep, kernel=True)
    assert calls == [name]
    with_package = function(scores, keep)
    assert calls == [name]  # the package, not the kernel
    torch.testing.assert_close(with_kernel, with_package, atol=1e-6, rtol=0)
    assert with_kernel[1, :, :, 10:].abs().sum() == 0 and with_kernel[0, :, 3].abs().sum() == 0
    grads = []
    for use_kernel in (True, False):
        x = scores.clone().requires_grad_()
        function(x, keep, kernel=use_kernel).mul(torch.arange(13.0)).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=0)
    assert grads[0][1, :, :, 10:].abs().sum() == 0


def test_kernel_mask_broadcasts_over_batch_and_heads():
    """keep (B|1, H|1, T, S) is read in place of a masked copy; hidden keys 0, empty rows 0."""
    torch.manual_seed(2)
    z = torch.randn(2, 3, 4, 6, dtype=torch.double) * 2
    for shape in [(1, 1, 4, 6), (2, 1, 4, 6), (1, 3, 4, 6), (2, 3, 4, 6)]:
        keep = torch.rand(shape) > 0.4
        keep[..., 0, :] = False  # an empty row
        for name in ("sparsemax", "entmax15"):
            p = sparse_maps.sparse_map(z, name, keep)
            expected = REFERENCE[name](z.masked_fill(~keep, -1e4), dim=-1).masked_fill(~keep, 0.0)
            torch.testing.assert_close(p, expected, atol=1e-12, rtol=0)
            assert p[..., 0, :].abs().sum() == 0


def test_failed_build_warns_and_falls_back(monkeypatch):
    missing = LazyExtension("missing", sparse_maps.SOURCE.with_name("missing.cpp"), sparse_maps.KERNEL.what, sparse_maps.KERNEL.fallback)
    monkeypatch.setattr(sparse_maps, "KERNEL", missing)
    with pytest.warns(UserWarning, match="sparsemax/entmax15 kernel unavailable"):
        assert sparse_maps.load() is None
    scores, keep = torch.randn(1, 1, 3, 5), torch.ones(1, 1, 3, 5, dtype=torch.bool)
    torch.testing.assert_close(sparsemax_weights(scores, keep), sparsemax(scores, dim=-1))


def test_the_route_chooser_takes_the_kernel_where_it_serves(monkeypatch):
    """The kernel-or-package choice is the route chooser's (issue 21): ``sparse`` on CPU,
    ``reference`` (the entmax package) when asked for or where the kernel is missing."""
    from reluformer_mt.attention import AttentionConfig, ReluformerAttention
    from helpers import route_of

    for fn in ("sparsemax", "entmax15"):
        module = ReluformerAttention(16, 2, AttentionConfig(fn=fn), self_attention=True)
        assert route_of(module, 5, 5) == "sparse"
        assert route_of(ReluformerAttention(16, 2, AttentionConfig(fn=fn, impl="reference"), self_attention=True),
                        5, 5) == "reference"
        monkeypatch.setattr(sparse_maps, "load", lambda verbose=False: None)
        assert route_of(module, 5, 5) == "reference"
        monkeypatch.undo()
