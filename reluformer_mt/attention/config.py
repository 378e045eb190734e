"""The options of one attention sublayer, each declared once, as a field of :class:`AttentionConfig`.

A field's metadata (:func:`option`) says everything about the option: its command-line name, help,
accepted values (choices and/or a range) and, for flags, whether the flag negates the field (the
paper's default is on, the flag turns it off). From it come the model's argparse arguments (and so
fairseq-hydra-train's ``model.*`` keys, read from the same namespace), the architecture defaults
(:func:`option_defaults`), the sublayer config of a model namespace (:func:`config_from_args`) and
the validation (:meth:`AttentionConfig.validate`), the way fairseq's own dataclass configs carry
their help in field metadata. Adding an option is one field here.
"""
import argparse
import math
from dataclasses import dataclass, field, fields
from typing import Callable, Dict, Iterator, Optional, Tuple, Union

from reluformer_mt.attention import routes
from reluformer_mt.attention.functions import ATTENTION_FUNCTIONS, POINTWISE_ACTIVATIONS, SIGMOID_BIAS_MODES
from reluformer_mt.model_args import fill_unset

GAMMA_MODES = ("fixed", "layer", "head")
RELA_VARIANTS = ("gated", "ungated")
SUBLAYERS = ("encoder", "decoder", "cross")


class AttentionOptionError(ValueError):
    """A bad attention option; the message names the option and the accepted values."""


def option(default, help: str, arg: Optional[str] = None, choices=None, accept: Optional[Callable] = None,
           expected: Optional[str] = None, kind: Optional[type] = None, negate: bool = False, metavar=None):
    """A dataclass field declaring one option.

    ``arg``: the command-line name (default: the field name with dashes); ``choices``: accepted
    names (a tuple, or a function returning one for registries that grow); ``kind`` + ``accept``:
    a number of that type for which ``accept`` holds (``expected`` says which, for errors);
    a value may be one of ``choices`` or such a number. Booleans are flags; ``negate``: the flag
    sets the field to False (``--relu-no-length-scale``)."""
    meta = dict(help=help, arg=arg, choices=choices, accept=accept, expected=expected, kind=kind, negate=negate,
                metavar=metavar)
    return field(default=default, metadata={"option": meta})


def _finite(x) -> bool:
    return math.isfinite(x)


@dataclass
class AttentionConfig:
    """Options of one attention sublayer (help texts below; references in docs/METHODS.md).

    (Secondary sources disagree whether ReLUFormer's gamma is learned; both are offered, fixed by
    default. ReLA-i's specialised gain initialisation is unpublished.)
    """

    fn: str = option("softmax", "weight function of the {sublayer}", arg="{sub}-attn-fn",
                     choices=ATTENTION_FUNCTIONS)
    relu_gamma: float = option(1.0, "ReLUFormer temperature gamma", kind=float, accept=lambda g: g > 0,
                               expected="a finite number > 0", metavar="G")
    relu_gamma_mode: str = option("fixed", "gamma fixed, or learned per layer / per head (initialised at --relu-gamma)",
                                  choices=GAMMA_MODES)
    relu_scale_logits: bool = option(True, "ReLUFormer: drop the 1/sqrt(d_h) inside the ReLU",
                                     arg="relu-no-logit-scale", negate=True)
    relu_length_scale: bool = option(True, "ReLUFormer ablation: drop the 1/sqrt(n_i/2) length factor (weights ReLU(s)/gamma)",
                                     arg="relu-no-length-scale", negate=True)
    rela_variant: str = option("gated", "ReLA-g (gated) or ReLA-i (ungated)", choices=RELA_VARIANTS)
    rela_gain_init: float = option(1.0, "initial RMSNorm gain of ReLA", kind=float, accept=lambda x: True,
                                   expected="a finite number", metavar="X")
    pointwise_alpha: float = option(1.0, "pointwise length exponent alpha", kind=float, accept=lambda a: 0 <= a <= 2,
                                    expected="a number in [0, 2]", metavar="A")
    pointwise_activation: str = option("relu", "pointwise activation h", arg="pointwise-h",
                                       choices=tuple(POINTWISE_ACTIVATIONS))
    qk_layernorm: bool = option(False, "LayerNorm on queries and keys")
    output_gate: bool = option(False, "gated attention unit: multiply the attention output by a projection of the input",
                               arg="attn-output-gate")
    output_norm: bool = option(False, "hybrid-norm: LayerNorm on the attention sublayer's output before the residual "
                                      "(sigmoid attention's stabiliser, Ramapuram et al. 2024)", arg="attn-output-norm")
    sigmoid_bias: Union[str, float] = option(
        "auto", "sigmoid attention's bias b in sigmoid(s + b): auto = -log n_i (default), "
                "learned = a scalar per head initialised at -log 64, or a fixed number",
        choices=SIGMOID_BIAS_MODES, kind=float, accept=lambda x: True, expected="auto, learned or a finite number",
        metavar="auto|learned|B")
    impl: str = option("auto", "the route of the attention core (attention/routes.py): reference, dense, "
                               "memory-bounded blocked, an accelerated kernel (fused: C++ CPU kernel built on first use; "
                               "flex: FlexAttention on CUDA), or auto", arg="attn-impl", choices=routes.impl_choices)
    blocked_min_len: int = option(2048, "auto: use the blocked route from this key length on", arg="attn-blocked-min-len",
                                  kind=int, accept=lambda n: n >= 1, expected="an integer >= 1", metavar="L")
    block_size: int = option(512, "block size of the blocked route", arg="attn-block-size", kind=int,
                             accept=lambda n: n >= 1, expected="an integer >= 1", metavar="B")

    def validate(self, sublayer: Optional[str] = None) -> "AttentionConfig":
        """Every field against its declaration; one-line :class:`AttentionOptionError` otherwise,
        naming the command-line option (of ``sublayer`` where the option is per sublayer)."""
        for spec in OPTIONS:
            value = getattr(self, spec.name)
            if not spec.flag and not spec.accepts(value):
                arg = spec.arg.format(sub=sublayer) if sublayer else spec.arg.replace("{sub}-", "")
                raise AttentionOptionError(f"--{arg}: got {value!r}, expected {spec.expected}")
        return self


@dataclass(frozen=True)
class OptionSpec:
    """One declared option (see :func:`option`)."""

    name: str
    default: object
    help: str
    arg: str
    choices: Union[Tuple[str, ...], Callable[[], Tuple[str, ...]], None]
    accept: Optional[Callable]
    kind: Optional[type]
    negate: bool
    metavar: Optional[str]
    expected_text: Optional[str]

    @property
    def flag(self) -> bool:
        return isinstance(self.default, bool)

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(self.choices() if callable(self.choices) else (self.choices or ()))

    @property
    def expected(self) -> str:
        return self.expected_text or "one of " + ", ".join(self.names)

    def dests(self) -> Iterator[str]:
        """The argparse destinations: one per sublayer for ``{sub}`` options."""
        if "{sub}" in self.arg:
            for sub in SUBLAYERS:
                yield self.arg.format(sub=sub).replace("-", "_")
        else:
            yield self.arg.replace("-", "_")

    def accepts(self, value) -> bool:
        if isinstance(value, str) and value in self.names:
            return True
        if self.kind is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        return _finite(value) and self.accept(value)

    def parse(self, text):
        """argparse type: a choice or a checked number, else argparse's one-line error."""
        if text in self.names:
            return text
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            value = None
        if value is None or not self.accepts(value):
            raise argparse.ArgumentTypeError(f"expected {self.expected}, got {text!r}")
        return value

    def from_args(self, value):
        """A namespace value (command line, architecture default or hydra config) as the field's."""
        if self.flag:
            return not value if self.negate else bool(value)
        if isinstance(value, str) and self.kind is not None and value not in self.names:
            try:  # a hydra config may give a number as a string
                return self.kind(value)
            except ValueError:
                return value  # validate names the option
        return value


def _spec(f) -> OptionSpec:
    meta = f.metadata["option"]
    return OptionSpec(name=f.name, default=f.default, help=meta["help"], arg=meta["arg"] or f.name.replace("_", "-"),
                      choices=meta["choices"], accept=meta["accept"], kind=meta["kind"], negate=meta["negate"],
                      metavar=meta["metavar"], expected_text=meta["expected"])


OPTIONS: Tuple[OptionSpec, ...] = tuple(_spec(f) for f in fields(AttentionConfig))
SUBLAYER_TEXT = {"encoder": "encoder self-attention", "decoder": "decoder (causal) self-attention",
                 "cross": "encoder-decoder attention"}


def add_attention_args(parser) -> None:
    """The attention options as argparse arguments (default None: architecture, then declared default)."""
    group = parser.add_argument_group("reluformer attention")
    for spec in OPTIONS:
        for sub in (SUBLAYERS if "{sub}" in spec.arg else (None,)):
            arg = "--" + spec.arg.format(sub=sub)
            help = spec.help.format(sublayer=SUBLAYER_TEXT.get(sub, ""))
            if spec.flag:
                group.add_argument(arg, action="store_true", default=None, help=help)
            elif spec.kind is None:
                group.add_argument(arg, choices=list(spec.names), help=help)
            else:
                group.add_argument(arg, type=spec.parse, metavar=spec.metavar, help=help)


def option_defaults() -> Dict[str, object]:
    """argparse destination -> default, as the namespace stores it (negated flags: False)."""
    defaults = {}
    for spec in OPTIONS:
        value = (not spec.default) if spec.flag and spec.negate else spec.default
        for dest in spec.dests():
            defaults[dest] = value
    return defaults


def fill_attention_defaults(args, **overrides) -> None:
    """Set each attention option not given on the command line: architecture value, then default."""
    fill_unset(args, option_defaults(), overrides)


def config_from_args(args, sublayer: str) -> AttentionConfig:
    """The AttentionConfig of one sublayer ('encoder', 'decoder' or 'cross') from a model namespace."""
    defaults, values = option_defaults(), {}
    for spec in OPTIONS:
        dest = spec.arg.format(sub=sublayer).replace("-", "_")
        values[spec.name] = spec.from_args(getattr(args, dest, defaults[dest]))
    return AttentionConfig(**values)


def validate_attention_args(args) -> None:
    """One-line errors naming the option and the accepted values, before any layer is built."""
    for sublayer in SUBLAYERS:
        config_from_args(args, sublayer).validate(sublayer)


__all__ = ["AttentionConfig", "AttentionOptionError", "GAMMA_MODES", "OPTIONS", "RELA_VARIANTS", "SUBLAYERS",
           "add_attention_args", "config_from_args", "fill_attention_defaults", "option_defaults",
           "validate_attention_args"]
