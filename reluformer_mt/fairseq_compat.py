"""Neutralise traps of the Python-3.11 fairseq builds (ve-fairseq / fairseq-fixed), once, at import.

1. torch >= 2.6 loads checkpoints with ``weights_only=True`` and refuses the argparse, omegaconf
   and numpy objects that fairseq stores in them. We *allowlist* exactly those types with
   ``torch.serialization.add_safe_globals`` instead of switching the safety check off, so a
   checkpoint carrying any other pickled object is still refused.
2. ``batch_by_size`` in these builds drops the final batch when the number of remaining
   sentences is not a multiple of ``--required-batch-size-multiple`` (upstream issues #5036,
   #5351): ``fairseq-generate`` translates 96 of 100 sentences. We wrap it so that every index
   it was given comes back in some batch; the missing ones form extra batches.
3. fairseq's own commands (``fairseq-train``, ``fairseq-generate`` with ``--user-dir
   reluformer_mt``) die with a traceback on a missing data folder or checkpoint, a truncated
   checkpoint, a full disk while saving, and ``--fp16`` / ``--bf16`` where they cannot run; a
   missing ``--restore-file`` even trains from scratch without a word. Before fairseq starts,
   :func:`check_train_config` / :func:`check_generate_config` refuse such input with a
   :class:`FairseqInputError`, and a failed checkpoint save becomes one as well; in fairseq's
   console commands :func:`install_one_line_errors` prints these, and the plugin's own option
   errors, as one line instead of a traceback. So does a resume whose options build another
   model than the checkpoint's (fairseq: "please ensure that the architectures match") and
   ``--attn-impl triton`` without CUDA.
4. fairseq-train resumed from a checkpoint that already reached ``--max-update`` trains one
   more update before it checks the limit; it stops at once instead.
"""
import argparse
import collections
import errno
import logging
import os
import sys
import typing
import zipfile

import numpy as np
import torch

logger = logging.getLogger(__name__)

_PATCHED_ATTR = "_reluformer_mt_patched"


def _checkpoint_safe_types():
    """The classes a fairseq checkpoint pickles besides tensors and builtins."""
    import omegaconf
    from omegaconf import base, nodes

    types = [
        argparse.Namespace,
        collections.defaultdict,
        collections.OrderedDict,
        typing.Any,
        # omegaconf pickles its element types by reference
        dict, list, tuple, set, int, float, str, bool, bytes,
        omegaconf.DictConfig,
        omegaconf.ListConfig,
        base.ContainerMetadata,
        base.Metadata,
        nodes.AnyNode,
        nodes.StringNode,
        nodes.IntegerNode,
        nodes.FloatNode,
        nodes.BooleanNode,
        nodes.EnumNode,
        np.dtype,
        np.ndarray,
        # numpy scalars (e.g. the BLEU stored by --eval-bleu as "best" metric) pickle through
        # these reconstructors and their dtype classes
        np.core.multiarray.scalar if hasattr(np, "core") else None,
        np.core.multiarray._reconstruct if hasattr(np, "core") else None,
    ]
    for name in ("Float64DType", "Float32DType", "Int64DType", "Int32DType", "BoolDType"):
        dtype_cls = getattr(getattr(np, "dtypes", None), name, None)
        if dtype_cls is not None:
            types.append(dtype_cls)
    for name in ("float64", "float32", "int64", "int32", "bool_"):
        types.append(getattr(np, name))
    return [t for t in types if t is not None]


def allow_fairseq_checkpoints():
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is None:  # torch < 2.4 loads everything anyway
        return
    add_safe_globals(_checkpoint_safe_types())


def _complete_batches(batch_by_size):
    """Wrap ``data_utils.batch_by_size`` so it never loses an index."""

    def batch_by_size_keeping_all(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None,
                                  max_sentences=None, required_batch_size_multiple=1,
                                  fixed_shapes=None):
        batches = batch_by_size(indices, num_tokens_fn, num_tokens_vec=num_tokens_vec,
                                max_tokens=max_tokens, max_sentences=max_sentences,
                                required_batch_size_multiple=required_batch_size_multiple,
                                fixed_shapes=fixed_shapes)
        if fixed_shapes is not None:
            return batches  # fixed shapes drop by design: TPU-style callers ask for it
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        batched = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if len(batches) else np.zeros(0, np.int64)
        if len(batched) == len(wanted):
            return batches
        missing = wanted[~np.isin(wanted, batched)]
        if len(missing) == 0:
            return batches
        # re-batch the leftovers with multiple 1: they are few and all must be seen
        extra = batch_by_size(missing, num_tokens_fn,
                              num_tokens_vec=None if num_tokens_vec is None else
                              np.asarray(num_tokens_vec)[np.isin(wanted, missing)],
                              max_tokens=max_tokens, max_sentences=max_sentences,
                              required_batch_size_multiple=1)
        return list(batches) + list(extra)

    batch_by_size_keeping_all.__wrapped__ = batch_by_size
    return batch_by_size_keeping_all


def keep_every_sentence():
    from fairseq.data import data_utils

    if getattr(data_utils.batch_by_size, _PATCHED_ATTR, False):
        return
    patched = _complete_batches(data_utils.batch_by_size)
    setattr(patched, _PATCHED_ATTR, True)
    data_utils.batch_by_size = patched


# ---------------------------------------------------------------- fairseq's own commands

class FairseqInputError(ValueError):
    """Bad input to one of fairseq's own commands, found by the plugin: one line."""


def _get(cfg, *keys):
    for key in keys:
        cfg = getattr(cfg, key, None) if cfg is not None else None
    return cfg


def precision_problem(common) -> typing.Optional[str]:
    """Where fairseq's --fp16 / --bf16 cannot run: fp16 (and --amp) train on CUDA only, and
    fairseq's --bf16 implies --tpu (torch_xla). bfloat16 and float16 autocast from Python (the
    tests' CPU checks) are another matter."""
    if _get(common, "bf16") or _get(common, "memory_efficient_bf16"):
        try:
            import torch_xla  # noqa: F401
        except ImportError:
            return ("--bf16: fairseq's --bf16 implies --tpu and needs torch_xla (not installed); "
                    "on a CUDA GPU train with --fp16, on a CPU in float32 (no precision option)")
    half = next((o for o in ("fp16", "memory_efficient_fp16", "amp") if _get(common, o)), None)
    if half and (_get(common, "cpu") or not torch.cuda.is_available()):
        why = "--cpu is given" if _get(common, "cpu") else "torch sees no CUDA device here"
        return f"--{half.replace('_', '-')}: fairseq trains in float16 on CUDA GPUs only ({why}); drop it to train in float32"
    return None


def checkpoint_file_problem(path, option: str) -> typing.Optional[str]:
    """A checkpoint fairseq would fail on with a traceback: a folder, or a file cut short (a
    torch.save file is a zip archive whose directory sits at its end; old pickle-format files,
    which start with the pickle protocol byte, are left to torch)."""
    if os.path.isdir(path):
        return f"{option} {path}: is a directory, expected a checkpoint file"
    if not os.path.isfile(path):
        return f"{option} {path}: checkpoint not found"
    if zipfile.is_zipfile(path):
        return None
    with open(path, "rb") as f:
        first = f.read(1)
    if first == b"\x80":
        return None
    return f"{option} {path}: not a complete checkpoint (truncated, or not written by torch.save)"


def _data_problem(data) -> typing.Optional[str]:
    for folder in str(data or "").split(os.pathsep) if data and "://" not in str(data) else ():
        if not os.path.isdir(folder):
            return (f"DATA {folder}: no such folder; give the directory written by fairseq-preprocess "
                    f"or reluformer-prepare")
    return None


def _restore_problem(checkpoint) -> typing.Optional[str]:
    """fairseq-train's checkpoint to resume or fine-tune from, as ``checkpoint_utils.load_checkpoint``
    picks it; a missing --restore-file other than the default would start training from scratch."""
    restore = _get(checkpoint, "restore_file") or "checkpoint_last.pt"
    suffix = _get(checkpoint, "checkpoint_suffix") or ""
    if restore != "checkpoint_last.pt":
        problem = checkpoint_file_problem(restore.replace(".pt", suffix + ".pt"), "--restore-file")
        return problem and problem.replace("checkpoint not found", "checkpoint not found (fairseq would train from scratch)")
    last = os.path.join(_get(checkpoint, "save_dir") or ".", f"checkpoint_last{suffix}.pt")
    if os.path.exists(last):
        return checkpoint_file_problem(last, "--save-dir checkpoint")
    finetune = _get(checkpoint, "finetune_from_model")
    if finetune:
        return checkpoint_file_problem(finetune, "--finetune-from-model")
    return None


def _device_problem(cfg) -> typing.Optional[str]:
    """The Triton kernel runs CUDA tensors only: without CUDA every attention call would raise."""
    if _get(cfg, "model", "attn_impl") == "triton" and (_get(cfg, "common", "cpu") or not torch.cuda.is_available()):
        why = "--cpu is given" if _get(cfg, "common", "cpu") else "torch sees no CUDA device here"
        return (f"--attn-impl triton: the Triton kernel trains on CUDA GPUs only ({why}); "
                "use --attn-impl auto (or fused, blocked) on the CPU")
    return None


def check_train_config(cfg) -> None:
    """fairseq-train's input, before the data, the model or the trainer are built."""
    for problem in (precision_problem(_get(cfg, "common")), _data_problem(_get(cfg, "task", "data")),
                    _restore_problem(_get(cfg, "checkpoint")), _device_problem(cfg)):
        if problem:
            raise FairseqInputError(problem)


# options that name files or runs, not the model: a resume may change them freely
_NOT_MODEL_OPTIONS = {"data", "_name", "user_dir", "eval_bleu", "eval_bleu_args", "eval_bleu_detok",
                      "eval_bleu_detok_args", "eval_bleu_print_samples", "eval_tokenized_bleu", "eval_bleu_remove_bpe"}


def _options(section) -> dict:
    if section is None:
        return {}
    if isinstance(section, argparse.Namespace):
        return dict(vars(section))
    from omegaconf import OmegaConf

    try:
        return dict(OmegaConf.to_container(section, resolve=True)) if OmegaConf.is_config(section) else dict(section)
    except Exception:  # a config that does not resolve: nothing to compare
        return {}


def changed_model_options(saved, current) -> typing.List[str]:
    """'--option saved (this run: current)' for each task or model option of ``current`` (a
    fairseq-train config) that differs in ``saved`` (the checkpoint's). fairseq-train's model
    section is a Namespace of every option: those of the other sections are left out."""
    elsewhere = set()
    for name in ("common", "common_eval", "distributed_training", "dataset", "optimization", "checkpoint",
                 "bmuf", "generation", "eval_lm", "interactive", "criterion", "optimizer", "lr_scheduler",
                 "scoring", "bpe", "tokenizer", "ema"):
        elsewhere |= set(_options(_get(current, name)))
    out = []
    for section in ("task", "model"):
        old, new = _options(_get(saved, section)), _options(_get(current, section))
        for key in new:
            if key in _NOT_MODEL_OPTIONS or (section == "model" and key in elsewhere) or key not in old:
                continue
            if old[key] != new[key] and str(old[key]) != str(new[key]):
                out.append(f"--{key.replace('_', '-')} {old[key]} (this run: {new[key]})")
    return list(dict.fromkeys(out))


def _explained_load(load_checkpoint):
    """fairseq's Trainer.load_checkpoint, whose "please ensure that the architectures match"
    (a traceback, naming nothing) becomes one line naming the checkpoint and the options that
    differ, e.g. a memory-attention run resumed without --tm-fusion attention."""

    def load(self, filename, *args, **kwargs):
        try:
            return load_checkpoint(self, filename, *args, **kwargs)
        except Exception as e:
            if type(e) is not Exception or "architectures match" not in str(e):
                raise
            from fairseq import checkpoint_utils

            try:
                saved = checkpoint_utils.load_checkpoint_to_cpu(filename).get("cfg")
            except Exception:  # not readable a second time: fairseq's own message
                raise e from None
            changed = changed_model_options(saved, self.cfg)
            what = ("trained with " + ", ".join(changed[:6]) + (", ..." if len(changed) > 6 else "")) if changed else \
                "its parameters do not fit the model these options build"
            restore = _get(self.cfg, "checkpoint", "restore_file") or "checkpoint_last.pt"
            option = "--save-dir checkpoint" if os.path.basename(restore) == "checkpoint_last.pt" else "--restore-file"
            raise FairseqInputError(f"{option} {filename}: {what}; give the options it was trained with to resume it, "
                                    "or another --save-dir to start a new run") from None

    setattr(load, _PATCHED_ATTR, True)
    return load


def _stopping_at_max_update(train):
    """fairseq_cli.train.train, which checks --max-update only after an update: a rerun of a
    finished run (or a resume past the limit) would train one update more."""

    def train_unless_done(cfg, trainer, task, epoch_itr):
        limit = _get(cfg, "optimization", "max_update")
        if limit and trainer.get_num_updates() >= limit:
            logging.getLogger("fairseq_cli.train").info(
                f"the checkpoint has {trainer.get_num_updates()} updates, --max-update {limit}: nothing to train")
            return [None], True
        return train(cfg, trainer, task, epoch_itr)

    train_unless_done.__wrapped__ = train
    setattr(train_unless_done, _PATCHED_ATTR, True)
    return train_unless_done


def check_resumes() -> None:
    import importlib

    from fairseq.trainer import Trainer

    if not getattr(Trainer.load_checkpoint, _PATCHED_ATTR, False):
        Trainer.load_checkpoint = _explained_load(Trainer.load_checkpoint)
    try:
        cli = importlib.import_module("fairseq_cli.train")
    except ImportError:
        return
    if not getattr(cli.train, _PATCHED_ATTR, False):
        cli.train = _stopping_at_max_update(cli.train)


def check_generate_config(cfg) -> None:
    """fairseq-generate's (and fairseq-validate's) input: the data folder and every --path."""
    if isinstance(cfg, argparse.Namespace):
        data, paths = getattr(cfg, "data", None), getattr(cfg, "path", None)
    else:
        data, paths = _get(cfg, "task", "data"), _get(cfg, "common_eval", "path")
    problems = [_data_problem(data)] + [checkpoint_file_problem(p, "--path")
                                        for p in (str(paths).split(os.pathsep) if paths and "://" not in str(paths) else ())]
    problem = next((p for p in problems if p), None)
    if problem:
        raise FairseqInputError(problem)


def _checked_main(main, check):
    def checked(cfg, *args, **kwargs):
        check(cfg)
        return main(cfg, *args, **kwargs)

    checked.__wrapped__ = main
    setattr(checked, _PATCHED_ATTR, True)
    return checked


def check_fairseq_commands() -> None:
    """fairseq-train's and fairseq-generate's ``main`` check their input first (``cli_main``
    looks ``main`` up when it calls it)."""
    import importlib

    for module, check in (("fairseq_cli.train", check_train_config), ("fairseq_cli.generate", check_generate_config),
                          ("fairseq_cli.validate", check_generate_config)):
        try:
            cli = importlib.import_module(module)
        except ImportError:  # a build without that command
            continue
        if not getattr(cli.main, _PATCHED_ATTR, False):
            cli.main = _checked_main(cli.main, check)


def _one_line_save(save):
    """A checkpoint save that fails (disk full, unwritable folder) as one line, without the
    half-written ``.tmp`` file fairseq leaves behind."""

    def torch_persistent_save(obj, filename, async_write: bool = False):
        try:
            return save(obj, filename, async_write)
        except (OSError, RuntimeError) as e:
            if isinstance(e, RuntimeError) and "write" not in str(e):
                raise  # not a write error: fairseq's own
            for partial in (f"{filename}.tmp",):
                if os.path.isfile(partial):
                    os.remove(partial)
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
            hint = " (is the disk full?)" if not (isinstance(e, OSError) and e.errno == errno.ENOSPC) else ""
            raise FairseqInputError(f"cannot write {filename}: {reason}{hint}") from None

    setattr(torch_persistent_save, _PATCHED_ATTR, True)
    return torch_persistent_save


def one_line_saves() -> None:
    from fairseq import checkpoint_utils

    if not getattr(checkpoint_utils.torch_persistent_save, _PATCHED_ATTR, False):
        checkpoint_utils.torch_persistent_save = _one_line_save(checkpoint_utils.torch_persistent_save)


PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _raised_in_plugin(tb) -> bool:
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and os.path.abspath(last.tb_frame.f_code.co_filename).startswith(PACKAGE_DIR + os.sep)


def one_line_error(error: BaseException) -> typing.Optional[str]:
    """The one line for an error of fairseq's command, or None for a traceback (a bug): the
    plugin's own errors (its option checks, this module's), a ValueError it raised, and a file
    error fairseq met (a missing dictionary, a full disk)."""
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        return None
    plugin_type = type(error).__module__.startswith("reluformer_mt")
    if isinstance(error, ValueError) and (plugin_type or _raised_in_plugin(error.__traceback__)):
        return " ".join(str(error).split("\n"))
    if isinstance(error, OSError) and error.filename and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return None


def install_one_line_errors() -> None:
    """In fairseq's console commands: print :func:`one_line_error`'s line instead of a traceback
    (exit status 1, as with the traceback); other errors keep theirs."""
    previous = sys.excepthook
    if getattr(previous, _PATCHED_ATTR, False):
        return

    def excepthook(kind, error, tb):
        line = one_line_error(error)
        if line is None:
            return previous(kind, error, tb)
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq"
        sys.stderr.write(f"{prog}: error: {line}\n")

    setattr(excepthook, _PATCHED_ATTR, True)
    sys.excepthook = excepthook


def apply():
    allow_fairseq_checkpoints()
    keep_every_sentence()
    check_fairseq_commands()
    one_line_saves()
    check_resumes()
