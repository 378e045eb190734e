"""Key-value memories (METHODS.md section 2): the FFN as a memory, and a large top-k MIPS memory.

Model options (``reluformer`` models; every architecture):

- ``--ffn-variant relu|softmax|softmax_ln`` and ``--ffn-slots N`` (the FFN width = number of
  slots, for encoder and decoder; default: the architecture's ``--*-ffn-embed-dim``);
- ``--memory-layers encoder:1,decoder:0``: these layers' FFNs become a :class:`MipsFfn` with
  ``--memory-slots``, ``--memory-topk``, ``--memory-key-dim``, ``--memory-activation``,
  ``--memory-index exact|hnsw|ivf`` and ``--memory-refresh-updates``.
"""
from typing import Dict, List

import torch.nn as nn

from reluformer_mt.memory.ffn import (FFN_VARIANTS, LayerNormedLinear, MemoryOptionError, check_ffn_variant,
                                      ffn_activation, ffn_readout, softmax_over_slots)
from reluformer_mt.memory.mips import (MEMORY_ACTIVATIONS, MEMORY_INDEXES, MipsFfn, MipsIndex,
                                       TopKMemory, check_memory_options, topk_read)
from reluformer_mt.model_args import fill_unset

MEMORY_DEFAULTS = {
    "ffn_variant": "relu",
    "ffn_slots": None,
    "memory_layers": "",
    "memory_slots": 65536,
    "memory_topk": 32,
    "memory_key_dim": None,
    "memory_activation": "relu",
    "memory_index": "exact",
    "memory_refresh_updates": 100,
}


def add_memory_args(parser) -> None:
    group = parser.add_argument_group("reluformer key-value memory")
    group.add_argument("--ffn-variant", metavar="V",
                       help=f"FFN as key-value memory: {', '.join(FFN_VARIANTS)} (H = act(X K^T) V; softmax_ln adds LN on H)")
    group.add_argument("--ffn-slots", type=int, metavar="N",
                       help="number of FFN memory slots (sets --encoder-ffn-embed-dim and --decoder-ffn-embed-dim)")
    group.add_argument("--memory-layers", metavar="SPEC",
                       help="replace these layers' FFN by a top-k MIPS memory, e.g. 'encoder:1,decoder:0' (0-based)")
    group.add_argument("--memory-slots", type=int, metavar="N", help="slots of each MIPS memory")
    group.add_argument("--memory-topk", type=int, metavar="K", help="slots retrieved and activated per query")
    group.add_argument("--memory-key-dim", type=int, metavar="D", help="key size of the MIPS memory (default: model dim)")
    group.add_argument("--memory-activation", metavar="A", help=f"over the k retrieved slots: {', '.join(MEMORY_ACTIVATIONS)}")
    group.add_argument("--memory-index", metavar="I",
                       help="faiss index: exact (IndexFlatIP), hnsw (HNSW, inner product) or ivf (IVF, inner product)")
    group.add_argument("--memory-refresh-updates", type=int, metavar="N",
                       help="rebuild the index from the training keys every N updates")


def fill_memory_defaults(args, **overrides) -> None:
    """Defaults for options not given; ``--ffn-slots`` then sets both FFN widths."""
    fill_unset(args, MEMORY_DEFAULTS, overrides)
    if args.ffn_slots is not None:
        if args.ffn_slots < 1:
            raise MemoryOptionError(f"--ffn-slots: got {args.ffn_slots}, expected a positive number of slots")
        args.encoder_ffn_embed_dim = args.decoder_ffn_embed_dim = args.ffn_slots


def parse_memory_layers(spec: str, encoder_layers: int, decoder_layers: int) -> Dict[str, List[int]]:
    """'encoder:1,decoder:0' -> {'encoder': [1], 'decoder': [0]}, checked against the layer counts."""
    chosen = {"encoder": [], "decoder": []}
    limits = {"encoder": encoder_layers, "decoder": decoder_layers}
    for item in filter(None, (s.strip() for s in (spec or "").split(","))):
        side, _, index = item.partition(":")
        if side not in chosen or not index.strip().isdigit():
            raise MemoryOptionError(f"--memory-layers: got {item!r}, expected SIDE:INDEX with SIDE encoder or decoder, e.g. encoder:1")
        if int(index) >= limits[side]:
            raise MemoryOptionError(f"--memory-layers: got {item!r}, expected an index below {limits[side]} (the {side} has {limits[side]} layers, 0-based)")
        chosen[side].append(int(index))
    return chosen


def validate_memory_args(args) -> None:
    check_ffn_variant(args.ffn_variant)
    layers = parse_memory_layers(args.memory_layers, args.encoder_layers, args.decoder_layers)
    if layers["encoder"] or layers["decoder"]:
        check_memory_options(args.memory_slots, args.memory_topk, args.memory_index, args.memory_activation,
                             args.memory_refresh_updates)


def configure_ffn(layer: nn.Module, cfg) -> None:
    """Give a fairseq layer the FFN variant of ``cfg``: its activation (fc2 comes from build_fc2)."""
    layer.activation_fn = ffn_activation(getattr(cfg, "ffn_variant", "relu") or "relu", layer.activation_fn)


def build_ffn_fc2(cfg, input_dim: int, output_dim: int, q_noise: float, qn_block_size: int) -> nn.Module:
    return ffn_readout(getattr(cfg, "ffn_variant", "relu") or "relu", input_dim, output_dim, q_noise, qn_block_size)


def _identity(x):
    return x


def attach_memory_layers(layers, args, side: str) -> None:
    """Replace the FFN of the chosen layers by a :class:`MipsFfn` (fc1 = memory, fc2 = identity)."""
    chosen = parse_memory_layers(getattr(args, "memory_layers", ""), args.encoder_layers, args.decoder_layers)[side]
    for i in chosen:
        layer = layers[i]
        embed_dim = layer.embed_dim
        layer.fc1 = MipsFfn(embed_dim, args.memory_slots, key_dim=args.memory_key_dim, topk=args.memory_topk,
                            activation=args.memory_activation, index=args.memory_index,
                            refresh_updates=args.memory_refresh_updates)
        layer.fc2 = nn.Identity()
        layer.activation_fn = _identity
