"""The Triton kernel (``attention/triton_kernel.py``) equals the reference path: outputs, the
regularisers' row statistics and the gradients of q, k, v and the learned row factor / bias, for
every covered function under key ranges, causal masks, padding rows and rows that see no key;
bf16 with float32 accumulation; and the ``--attn-impl triton`` / ``auto`` route of the sublayer.

Without a GPU the kernels run in Triton's CPU interpreter. TRITON_INTERPRET=1 must be set before
triton itself is imported (its own library functions, tl.sum, tl.sigmoid, are built then), which
other test files do first in one pytest process; so a plain run of this file starts itself once
more in a subprocess with the variable set (``test_this_file_in_the_triton_interpreter``). On a
CUDA machine the same tests run on the GPU (``benchmarks/gpu_check.sh``).
"""
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton): nothing to test")

from reluformer_mt.attention import AttentionConfig, ReluformerAttention, record_attention  # noqa: E402
from reluformer_mt.attention import triton_kernel  # noqa: E402
from helpers import route_of  # noqa: E402
from reluformer_mt.attention import routes  # noqa: E402
from reluformer_mt.attention.functions import Params, get_function  # noqa: E402
from reluformer_mt.attention.visibility import Visibility  # noqa: E402

INTERPRETED = triton_kernel.interpreting()
DEVICE = "cpu" if INTERPRETED else ("cuda" if torch.cuda.is_available() else None)
LAUNCHER = "test_this_file_in_the_triton_interpreter"
ROW_PARAMETERS = ("log_gamma", "sigmoid_bias")

B, H, D = 3, 2, 12  # D not a power of two: the kernel pads it to 16 with masked loads
TILES = (16, 16)  # several tiles per row and per column at these lengths

CASES = [
    ("relu", {}),
    ("relu", {"relu_gamma_mode": "head", "relu_gamma": 1.3}),
    ("relu", {"relu_length_scale": False, "relu_gamma_mode": "layer"}),
    ("rela", {}),
    ("pointwise", {"pointwise_alpha": 0.5}),
    ("pointwise", {"pointwise_activation": "relu2"}),
    ("sigmoid", {}),
    ("sigmoid", {"sigmoid_bias": "learned"}),
    ("pointwise", {"pointwise_activation": "softplus"}),
    ("pointwise", {"pointwise_activation": "gelu"}),
    ("pointwise", {"pointwise_activation": "relu6"}),
    ("pointwise", {"pointwise_activation": "identity"}),
]


COMPILE_TEST = "test_kernels_compile_for_sm90_within_its_shared_memory"


@pytest.fixture(autouse=True)
def kernel_device(request):
    """Every test but the launcher and the compile check needs the interpreter or a GPU."""
    if request.node.originalname not in (LAUNCHER, COMPILE_TEST) and DEVICE is None:
        pytest.skip("no CUDA and TRITON_INTERPRET is not 1: covered by " + LAUNCHER)


def test_this_file_in_the_triton_interpreter():
    if DEVICE is not None:
        pytest.skip("already running on a kernel device")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__],
                          cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


def visibility(kind: str):
    """(T, S, Visibility) of one mask pattern."""
    if kind == "none":  # cross-attention, every key visible
        return 29, 37, Visibility(29, 37)
    if kind == "padding":  # left-padded sources (fairseq's encoder side) in one batch
        kpm = torch.zeros(B, 37, dtype=torch.bool, device=DEVICE)
        kpm[1, :9] = True
        kpm[2, :36] = True
        return 29, 37, Visibility.from_padding(29, 37, kpm)
    if kind == "causal_right":  # decoder self-attention, right padding: padding query rows still compute
        kpm = torch.zeros(B, 37, dtype=torch.bool, device=DEVICE)
        kpm[0, 20:] = True
        kpm[2, 33:] = True
        return 37, 37, Visibility.from_padding(37, 37, kpm, causal=True)
    if kind == "causal_left":  # left padding + causal: the first rows of sentence 1 see no key at all
        kpm = torch.zeros(B, 37, dtype=torch.bool, device=DEVICE)
        kpm[1, :18] = True
        return 37, 37, Visibility.from_padding(37, 37, kpm, causal=True)
    if kind == "decoding":  # causal with fewer queries than keys (offset S - T)
        return 5, 37, Visibility(5, 37, causal_offset=32)
    raise ValueError(kind)


MASKS = ["none", "padding", "causal_right", "causal_left", "decoding"]


def function_and_params(fn, options):
    config = AttentionConfig(fn=fn, **options).validate()
    function = get_function(fn)
    torch.manual_seed(7)
    learned = {name: p.to(DEVICE) for name, p in function.make_parameters(config, H, H * D).items()}
    with torch.no_grad():  # values away from the initialisation, different per head
        for p in learned.values():
            p.add_(0.3 * torch.randn(p.shape).to(DEVICE))
    # the tensors inside the weights (ReLA's gain and gate act after the attention, not here)
    learned = {name: torch.nn.Parameter(p.detach()) for name, p in learned.items() if name in ROW_PARAMETERS}
    return function, config, learned


def inputs(T, S, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(device=DEVICE, dtype=dtype) for n in (T, S, S))
    return q, k, v


def reference(q, k, v, vis, function, config, learned, scaling):
    """The reference path in float64: the function's own weights on the full logits."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    params = {name: p.detach().double().requires_grad_(True) for name, p in learned.items()}
    keep, n_visible = vis.dense(q.device), vis.n_visible(q.device)
    scores = (q * scaling) @ k.transpose(-1, -2)
    w = function.weights(scores, keep, n_visible, Params(config, params))
    live = w > 0  # a log a with the gradient log a + 1 where a > 0 and 0 elsewhere (xlogy's is NaN at 0)
    rows = (w.sum(-1), torch.where(live, w * torch.log(torch.where(live, w, 1.0)), 0.0).sum(-1), (w != 0).sum(-1))
    return (w @ v, rows), (q, k, v), params


def kernel(q, k, v, vis, function, config, learned, scaling):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    params = Params(config, learned)
    n_visible = vis.n_visible(q.device)
    out, rows, _ = triton_kernel.triton_tiled_attention(
        q, k, v, vis, activation=function.activation(config), scaling=scaling,
        row_factor=function.row_factor(n_visible, params, q.dtype),
        row_bias=function.row_bias(n_visible, params, q.dtype),
        n_visible=n_visible, want_rows=True, tiles=TILES)
    return (out, rows[:3]), (q, k, v), learned


def loss(out, rows, seed=3, xlogx=True):
    """Touches every output and both differentiable row statistics with fixed random weights."""
    g = torch.Generator().manual_seed(seed)
    w_out = torch.randn(out.shape, generator=g, dtype=torch.float64).to(DEVICE)
    w_mass, w_xlogx = (torch.randn(rows[0].shape, generator=g, dtype=torch.float64).to(DEVICE) for _ in range(2))
    total = (out.double() * w_out).sum() + (rows[0].double() * w_mass).sum()
    return total + (rows[1].double() * w_xlogx).sum() if xlogx else total


def assert_close(got, want, rel, what):
    """max |got - want| <= rel * max |want| (an error relative to the tensor's scale)."""
    got, want = got.detach().double(), want.detach().double()
    scale = want.abs().max().clamp_min(1e-12)
    err = (got - want).abs().max() / scale
    assert err <= rel, f"{what}: relative error {float(err):.2e} > {rel:.0e}"


def check(fn, options, mask, dtype, rel, rel_grad):
    function, config, learned = function_and_params(fn, options)
    T, S, vis = visibility(mask)
    q, k, v = inputs(T, S, dtype)
    scaling = D ** -0.5
    (ref_out, ref_rows), ref_in, ref_params = reference(q, k, v, vis, function, config, learned, scaling)
    for p in learned.values():
        p.grad = None
    (out, rows), got_in, got_params = kernel(q, k, v, vis, function, config, learned, scaling)
    assert out.dtype == dtype and rows[0].dtype == torch.float32
    assert_close(out, ref_out, rel, "out")
    assert_close(rows[0], ref_rows[0], rel, "mass")
    # sum a log a is defined for a >= 0: with signed weights (gelu, identity) the regularisers run on
    # the reference path, and the kernel's number (a log max(a, 1e-30), as the blocked path's) is not compared
    signed = function.signed(config)
    if not signed:
        assert_close(rows[1], ref_rows[1], rel, "sum a log a")
    if dtype == torch.float32:
        assert torch.equal(rows[2], ref_rows[2]), "non-zero counts"
    else:  # a logit within float32 rounding of 0 may change sign (or relu2's square underflow)
        off = (rows[2] - ref_rows[2]).abs()
        assert int(off.max()) <= 1 and int(off.sum()) <= 0.01 * int(ref_rows[2].sum()), "non-zero counts"
    names = list(learned)
    # d(a log a)/da = log a + 1 is unbounded near a = 0: where a logit within float32 rounding
    # of 0 changes sign (bf16 inputs), that term's gradient differs by any amount, so bf16
    # checks the gradients of the output and the mass only (float32 checks all three)
    exact = dtype == torch.float32 and not signed
    ref_grads = torch.autograd.grad(loss(ref_out, ref_rows, xlogx=exact), [*ref_in, *(ref_params[n] for n in names)])
    grads = torch.autograd.grad(loss(out, rows, xlogx=exact), [*got_in, *(got_params[n] for n in names)])
    for what, got, want in zip(["q", "k", "v", *names], grads, ref_grads):
        assert_close(got, want, rel_grad, f"d{what}")


# every mask for a row factor and a row bias (both learned per head), every function under the
# hardest mask (causal, padding rows, rows without keys): the interpreter takes ~1 s per case
FLOAT32_CASES = ([(*CASES[1], mask) for mask in MASKS] + [(*CASES[7], mask) for mask in MASKS]
                 + [(*case, "causal_left") for case in CASES if case not in (CASES[1], CASES[7])])


@pytest.mark.parametrize("fn,options,mask", FLOAT32_CASES)
def test_kernel_equals_reference_in_float32(fn, options, mask):
    check(fn, options, mask, torch.float32, 1e-5, 1e-5)


@pytest.mark.parametrize("fn,options,mask", [(*CASES[1], "causal_right"), (*CASES[5], "padding"),
                                              (*CASES[7], "causal_left")])
def test_kernel_in_bfloat16_accumulates_in_float32(fn, options, mask):
    """bf16 inputs and outputs, float32 logits, weights and row sums: errors of bf16 rounding
    (the weights enter the a v product in bf16, as in FlashAttention), not of bf16 sums."""
    check(fn, options, mask, torch.bfloat16, 2e-2, 3e-2)


def test_rows_without_visible_keys_are_exact_zeros():
    function, config, learned = function_and_params("relu", {})
    T, S, vis = visibility("causal_left")
    q, k, v = inputs(T, S, torch.float32)
    (out, rows), _, _ = kernel(q, k, v, vis, function, config, learned, 1.0)
    empty = vis.n_visible(q.device).view(-1, T) == 0  # sentence 1, rows 0..17 (its first key is 18)
    assert int(empty.sum()) == 18 and bool(empty[1, :18].all())
    assert torch.all(out[1, :, :18] == 0) and torch.all(rows[0][1, :, :18] == 0) and torch.all(rows[2][1, :, :18] == 0)
    assert torch.isfinite(out).all() and torch.isfinite(rows[1]).all()


def test_every_registered_activation_is_covered():
    from reluformer_mt.attention.functions import POINTWISE_ACTIVATIONS

    assert set(triton_kernel.ACTIVATIONS) == set(POINTWISE_ACTIVATIONS)
    tested = {case[1].get("pointwise_activation", "relu") for case in CASES if case[0] == "pointwise"}
    assert tested | {"sigmoid"} == set(POINTWISE_ACTIVATIONS)


def test_uncovered_calls_fall_back_to_the_blocked_path():
    """A dense mask (padding inside a sentence) still gives the reference's result, through the
    fallback; so would returned weights or an activation the kernel lacks."""
    function, config, learned = function_and_params("pointwise", {"pointwise_activation": "softplus"})
    kpm = torch.zeros(B, 37, dtype=torch.bool, device=DEVICE)
    kpm[0, 10:12] = True  # a hole: not a key range
    vis = Visibility.from_padding(29, 37, kpm)
    assert not vis.ranges_hold() and not triton_kernel.applies("softplus", vis.resolved(), False)
    assert not triton_kernel.applies("relu", None, True) and not triton_kernel.applies("tanh", None, False)
    q, k, v = inputs(29, 37, torch.float32)
    (ref_out, _), _, _ = reference(q, k, v, vis, function, config, learned, 0.5)
    (out, _), _, _ = kernel(q, k, v, vis, function, config, learned, 0.5)
    assert_close(out, ref_out, 1e-5, "out")


# --------------------------------------------------------------------------- the sublayer's route
E = H * D


def sublayer(fn, impl, options, seed=0):
    torch.manual_seed(seed)
    config = AttentionConfig(fn=fn, impl=impl, **options)
    return ReluformerAttention(E, H, config, self_attention=True).to(DEVICE)


@pytest.mark.parametrize("fn,options", [CASES[1], CASES[3], CASES[7]])
def test_sublayer_with_attn_impl_triton_equals_reference(fn, options):
    """Decoder self-attention (causal, right-padded batch) with ReLUFormer's regularisers
    recorded: output, every recorded number (padding rows excluded) and parameter gradients."""
    torch.manual_seed(4)
    x = torch.randn(21, B, E).to(DEVICE)
    kpm = torch.zeros(B, 21, dtype=torch.bool, device=DEVICE)
    kpm[1, 15:] = True
    mask = torch.triu(torch.full((21, 21), float("-inf")), 1).to(DEVICE)
    results = {}
    for impl in ("reference", "triton"):
        module = sublayer(fn, impl, options)
        with record_attention(module, regularise=True) as record:
            out, _ = module(x, x, x, key_padding_mask=kpm, attn_mask=mask, need_weights=False)
        totals = record.totals()
        assert {"norm_loss", "entropy_margin", "rows", "zeros"} <= totals.keys()
        objective = out.square().sum() + sum(v for k, v in totals.items() if k in ("norm_loss", "entropy_margin"))
        objective.backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
        results[impl] = (out, totals, grads)
    (ref_out, ref_totals, ref_grads), (out, totals, grads) = results["reference"], results["triton"]
    assert_close(out, ref_out, 1e-5, "out")
    assert totals.keys() == ref_totals.keys()
    for key in totals:
        assert float(totals[key]) == pytest.approx(float(ref_totals[key]), rel=1e-5, abs=1e-6), key
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        assert_close(grads[name], ref_grads[name], 1e-4, name)


def test_attn_impl_triton_without_cuda_is_one_clear_error(monkeypatch):
    assert "triton" in routes.impl_choices()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    module = sublayer("relu", "triton", {}).cpu()
    x = torch.randn(5, 2, E)
    with pytest.raises(RuntimeError, match=r"^--attn-impl triton: runs on CUDA tensors only, got cpu"):
        module(x, x, x, need_weights=False)


def test_auto_routes_cuda_calls_with_statistics_to_triton(monkeypatch):
    """auto: the kernel for every CUDA call it serves (measured faster than FlexAttention on an
    H200), with or without row statistics, and never on the CPU."""
    # no FlexAttention import, no C++ build: only the route is under test
    monkeypatch.setenv("RELUFORMER_NO_FLEX", "1")
    monkeypatch.setenv("RELUFORMER_NO_FUSED", "1")
    cuda_q = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, device=torch.device("cuda"), requires_grad=True,
                                   size=lambda dim: (1, H, 512, D)[dim])
    cpu_q = torch.zeros(1, H, 512, D, requires_grad=True)  # auto never takes the kernel on the CPU, interpreter or not
    for fn in ("relu", "rela", "sigmoid"):
        module = sublayer(fn, "auto", {})
        assert route_of(module, 512, 512, q=cuda_q) == "triton"
        with record_attention(module, regularise=True):
            assert route_of(module, 512, 512, want_rows=True, q=cuda_q) == "triton"
            assert route_of(module, 512, 512, want_weights=True, want_rows=True, q=cuda_q) != "triton"
            assert route_of(module, 512, 512, want_rows=True, q=cpu_q) != "triton"
            monkeypatch.setenv("RELUFORMER_NO_TRITON", "1")
            assert route_of(module, 512, 512, want_rows=True, q=cuda_q) != "triton"
            monkeypatch.delenv("RELUFORMER_NO_TRITON")
    signed = sublayer("pointwise", "auto", {"pointwise_activation": "gelu"})
    with record_attention(signed, regularise=True):  # signed weights regularise on the reference route
        assert route_of(signed, 512, 512, want_rows=True, q=cuda_q) == "reference"
    with record_attention(signed):  # statistics only: the kernel
        assert route_of(signed, 512, 512, want_rows=True, q=cuda_q) == "triton"


# --------------------------------------------------------------------------- compiled for a GPU, without one
SM90_SHARED_LIMIT = 227 * 1024  # bytes of shared memory one block may use on H100 / H200


def test_kernels_compile_for_sm90_within_its_shared_memory():
    """What the interpreter cannot show: the three kernels pass Triton's compiler down to sm_90
    code (H100/H200) with the constants and launch options of a bf16 call at
    transformer_iwslt_de_en's head size 128 (row factor and row bias both on, causal, statistics:
    every optional branch), and fit the shared memory of one block there. (~10 s; fp32 at 128,
    relu and relu2 were compiled the same way by hand: see ``triton_kernel._constants``.)"""
    if INTERPRETED:
        pytest.skip("kernels are interpreted functions under TRITON_INTERPRET=1")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    head_dim = 128
    q = torch.empty(1, 1, head_dim, dtype=torch.bfloat16)
    data = {"Q", "K", "V", "Out", "DO", "DQ", "DK", "DVv"}
    consts = triton_kernel._constants(q, q, q, True, "sigmoid", True, triton_kernel.BLOCK_M, triton_kernel.BLOCK_N,
                                      head_dim, head_dim)
    options = {key: consts.pop(key) for key in ("num_warps", "num_stages")}
    for kernel in (triton_kernel._fwd_kernel, triton_kernel._bwd_kv_kernel, triton_kernel._bwd_q_kernel):
        signature = {}
        pointers = kernel.arg_names[:kernel.arg_names.index("T")]  # the tensors come first
        for name in kernel.arg_names:
            if name in consts:
                signature[name] = "constexpr"
            elif name in pointers:
                signature[name] = ("*bf16" if name in data
                                   else "*i64" if name in ("Starts", "Ends", "Nnz") else "*fp32")
            else:
                signature[name] = "fp32" if name == "scale" else "i32"
        compiled = triton.compile(ASTSource(kernel, signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                                  options=options)
        assert 0 < compiled.metadata.shared <= SM90_SHARED_LIMIT, (kernel.__name__, compiled.metadata.shared)
