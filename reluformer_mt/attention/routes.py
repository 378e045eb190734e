"""How one attention call runs: :func:`choose_route`, the one place that decides, returns a named route.

Routes (all give the same results up to float rounding; docs/PERFORMANCE.md measures them):

- ``fairseq``: fairseq's own ``MultiheadAttention.forward`` (PyTorch's fused softmax attention),
  for plain softmax sublayers that need no per-head weights;
- ``reference``: the logits, then the weight function's ``weights()`` (:mod:`.functions`), then
  ``weights @ v``; the only route for normalised functions, additive float masks, attention
  dropout in training and regularised rows of signed weights;
- ``direct``: one tile of plain tensor ops for short calls of functions without a row normaliser
  (``tiled``): h = relu with autograd, or any h without gradients (decoding steps);
- ``dense`` / ``blocked``: the tiled autograd kernel of :mod:`.blocked`, whole key rows / blocks of
  ``block_size`` (nothing of size T x S kept);
- accelerated routes, registered in :data:`ACCELERATED` with what they can serve: ``fused`` (the
  C++ CPU kernel of :mod:`.fused`) and ``flex`` (FlexAttention on CUDA, :mod:`.flex`) for h = relu,
  ``triton`` (the Triton kernel of :mod:`.triton_kernel`, issue 24) for every h of the tiled
  functions, with row factors, biases and row statistics, and ``sparse`` (:mod:`.sparse_maps`: the reference route with sparsemax / 1.5-entmax weights
  from a C++ row kernel instead of the ``entmax`` package).

``--attn-impl`` asks for a route (``auto`` lets this module choose). An accelerated route asked for
but unable to serve a call falls back to the route named in its registration, decided here and
logged once per reason. Adding an accelerated route is one :func:`register_route` call in the
kernel's module, imported where :mod:`.multihead` imports ``flex`` and ``fused``; ``--attn-impl``
then offers it (the config's choices come from :func:`impl_choices`).
"""
import logging
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from torch import Tensor

from reluformer_mt.attention.visibility import Visibility

logger = logging.getLogger(__name__)

# rows x keys up to which a dense call is one tile (1 MB of float32 per head: the L2 cache here);
# below it the ``direct`` route's plain tensor ops beat the tiling's bookkeeping (docs/PERFORMANCE.md)
DENSE_TILE_ELEMENTS = 2 ** 18

# routes that need no registration; ``reference`` can also be asked for (tests, comparisons)
BASE_ROUTES = ("fairseq", "reference", "direct", "dense", "blocked")


@dataclass(frozen=True)
class Call:
    """What a call asks for, as the chooser sees it.

    ``head_weights`` / ``before_softmax``: fairseq's forward arguments (fairseq's own forward
    averages the heads); ``q``: the projected queries (B, H, T, D) (device and dtype decide the
    accelerated routes), None before the projections; ``visible``: the visible keys
    (``key_ranges`` asks whether they are ranges + a causal flag); ``needs_grad``: gradients flow to q, k, v or the
    function's parameters.
    """

    head_weights: bool = False
    before_softmax: bool = False
    q: Optional[Tensor] = None
    tgt_len: int = 0
    src_len: int = 0
    want_weights: bool = False
    want_rows: bool = False
    additive: bool = False
    dropout: bool = False
    regularised: bool = False
    needs_grad: bool = False
    visible: Optional[Visibility] = None  # the call's Visibility (None: every key visible)

    @property
    def key_ranges(self) -> bool:
        """Whether the visible keys are key ranges + a causal flag (no dense mask); asked only by
        the routes that take ranges, so other calls never wait for a padding mask's host check."""
        v = self.visible
        return v is None or v.resolved().mask is None or v.all_visible


@dataclass(frozen=True)
class AcceleratedRoute:
    """A kernel for h = relu without row bias (``WeightFunction.fused_relu``).

    ``cannot_serve(call)``: None when the kernel runs this call, else the reason (one line);
    ``auto(call)``: whether ``--attn-impl auto`` takes it for a call it can serve;
    ``fallback``: what an explicit ``--attn-impl <name>`` runs where it cannot serve: ``blocked``
    or ``auto`` (the route ``auto`` would choose without it).
    ``weights_of(function, config)``: set for a kernel of a (non-tiled) function's weights on the
    reference route instead (taken wherever it can serve, unless ``--attn-impl reference``).
    ``serves(function, config)``: the tiled functions it computes (default: h = relu without row
    bias, ``WeightFunction.fused_relu``); ``require(call)``: run when ``--attn-impl <name>`` asks
    for it explicitly, raises a one-line error where asking for it makes no sense (no fallback);
    ``announce``: ``auto`` logs once per reason when a call it would take (``auto(call)``) cannot be served;
    ``priority``: ``auto`` tries the routes from the highest priority down (registration order
    among equals), so a measured-faster kernel goes first whatever module registers first.
    """

    name: str
    cannot_serve: Callable[[Call], Optional[str]]
    auto: Callable[[Call], bool]
    fallback: str = "auto"
    weights_of: Optional[Callable] = None
    serves: Optional[Callable] = None
    require: Optional[Callable[[Call], None]] = None
    announce: bool = False
    priority: int = 0

    def computes(self, function, config) -> bool:
        """Whether this kernel computes ``function`` under ``config`` (its domain)."""
        return self.serves(function, config) if self.serves is not None else function.fused_relu(config)


ACCELERATED: Dict[str, AcceleratedRoute] = {}


def register_route(name: str, cannot_serve: Callable[[Call], Optional[str]], auto: Callable[[Call], bool],
                   fallback: str = "auto", weights_of: Optional[Callable] = None, serves: Optional[Callable] = None,
                   require: Optional[Callable[[Call], None]] = None, announce: bool = False,
                   priority: int = 0) -> AcceleratedRoute:
    """Add an accelerated route (``auto`` tries them by ``priority``, then in registration order)."""
    if name in BASE_ROUTES:
        raise ValueError(f"route {name!r} is built in")
    ACCELERATED[name] = route = AcceleratedRoute(name, cannot_serve, auto, fallback, weights_of, serves, require,
                                                 announce, priority)
    return route


def impl_choices() -> Tuple[str, ...]:
    """The values of ``--attn-impl`` (weight kernels are not asked for: they serve where they can)."""
    return ("auto", "reference", "dense", "blocked") + tuple(n for n, r in ACCELERATED.items() if r.weights_of is None)


def computes_weights(route: str) -> bool:
    """Whether ``route`` runs the reference formula (its weights from the function or a kernel)."""
    return route == "reference" or (route in ACCELERATED and ACCELERATED[route].weights_of is not None)


def routes() -> Tuple[str, ...]:
    """Every route name."""
    return BASE_ROUTES + tuple(ACCELERATED)


_logged = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        logger.warning(message)


def uses_fairseq_forward(function, config) -> bool:
    """Plain softmax attention (no qk-layernorm, gate or output norm) can run fairseq's forward."""
    return function.name == "softmax" and not (config.qk_layernorm or config.output_gate or config.output_norm)


def choose_route(function, config, call: Call) -> Optional[str]:
    """The route of one attention call (see the module docstring), fallbacks included.

    The module asks first with ``call.q`` None (before projecting anything): the answer is
    ``fairseq`` when fairseq's own forward runs the whole call, else None; it then projects the
    queries and keys and asks again with the whole call."""
    if uses_fairseq_forward(function, config) and not call.head_weights and not call.before_softmax:
        return "fairseq"
    if call.q is None:
        return None
    if config.impl == "reference":
        return "reference"
    if not function.tiled:
        return _weights_route(function, config, call)
    if call.additive or call.dropout:
        return "reference"
    if call.regularised and function.signed(config):
        return "reference"  # the row entropy of signed weights is the reference's definition
    impl = config.impl
    accelerated = ACCELERATED.get(impl)
    if accelerated is not None:
        if accelerated.require is not None:
            accelerated.require(call)
        in_domain = accelerated.computes(function, config) and not call.want_weights
        reason = None if in_domain else "needs a function it computes and no returned weights"
        reason = reason or accelerated.cannot_serve(call)
        if reason is None:
            return impl
        if in_domain:  # outside its domain (other functions, weights wanted) nothing is a fallback
            _log_once(f"--attn-impl {impl}: {reason}; running the {accelerated.fallback} route instead")
        impl = accelerated.fallback
    elif impl == "auto" and not call.want_weights:
        for route in sorted(ACCELERATED.values(), key=lambda r: -r.priority):
            if route.weights_of is not None or not route.computes(function, config) or not route.auto(call):
                continue
            reason = route.cannot_serve(call)
            if reason is None:
                return route.name
            if route.announce:  # e.g. FlexAttention on CUDA: say once why a call runs elsewhere (issue 23)
                _log_once(f"--attn-impl auto: the {route.name} route cannot serve {reason}; running another route")
    return _tiled_route(function, config, call, impl)


def _weights_route(function, config, call: Call) -> str:
    """A registered kernel of the function's weights where it can serve, else ``reference``."""
    for route in ACCELERATED.values():
        if route.weights_of is not None and route.weights_of(function, config) and route.cannot_serve(call) is None:
            return route.name
    return "reference"


def _tiled_route(function, config, call: Call, impl: str) -> str:
    """``direct``, ``dense`` or ``blocked`` for ``impl`` dense, blocked or auto (blocked from
    ``blocked_min_len`` keys on, except for single-query decoding steps); weights need dense."""
    long_call = impl == "auto" and call.src_len >= config.blocked_min_len and call.tgt_len > 1
    if (impl == "blocked" or long_call) and not call.want_weights:
        return "blocked"
    if call.tgt_len * call.src_len <= DENSE_TILE_ELEMENTS:
        if function.fused_relu(config):
            return "direct"
        if not call.needs_grad and not call.want_rows and not call.want_weights:
            return "direct"
    return "dense"


__all__ = ["ACCELERATED", "AcceleratedRoute", "BASE_ROUTES", "Call", "DENSE_TILE_ELEMENTS",
           "choose_route", "computes_weights", "impl_choices", "register_route", "routes", "uses_fairseq_forward"]
