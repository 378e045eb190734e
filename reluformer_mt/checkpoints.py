"""The one checkpoint loader of every tool (translate, eval, demo, study, sweep).

One safety policy: checkpoints are read with ``torch.load(weights_only=True)`` and the plugin's
allowlist of the types fairseq pickles (:mod:`reluformer_mt.fairseq_compat`), on every torch
version; a checkpoint holding any other pickled object is refused with one line naming the file
and the refused type, never loaded with ``weights_only=False``.

- :func:`read_state`: the checkpoint's dict (what fairseq's ``load_checkpoint_to_cpu`` returns);
- :func:`checkpoint_info`: parameter count, updates and architecture, without building a model;
- :func:`load_model` (= :func:`open_checkpoint` + :meth:`OpenedCheckpoint.load`): model, task,
  config, the data directory with its :class:`Prepared`, SentencePiece processors, separator and
  the attention modules by kind, on a device.

The data directory is ``data`` when given, else the first of the checkpoint's folder and the
directory it was trained on (``task.data``) that holds both dictionaries.
"""
import argparse
import logging
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch

from reluformer_mt import fairseq_compat
from reluformer_mt.data.prepared import PREPARED_NAME, Prepared, load_sentencepiece, parse_spm_models
from reluformer_mt.data.segments import SEPARATOR

KINDS = ("encoder_self", "decoder_self", "cross")
_MODULE_SUFFIX = {"cross": "encoder_attn", "decoder_self": "self_attn", "encoder_self": "self_attn"}
_MODULE_STACK = {"cross": "decoder", "decoder_self": "decoder", "encoder_self": "encoder"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: one line naming the file and the reason."""


# ---------------------------------------------------------------- reading

def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _refusal(path: Path, e: pickle.UnpicklingError) -> CheckpointError:
    """torch's many-line weights_only error -> one line with the refused type."""
    text = str(e)
    refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if refused:
        return CheckpointError(f"{path}: refused: the checkpoint holds a pickled {refused.group(1)}, which is not a type "
                               "fairseq checkpoints store (reluformer_mt loads checkpoints with weights_only=True and an "
                               "allowlist, never arbitrary pickled objects)")
    detail = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    return CheckpointError(f"{path}: cannot load the checkpoint ({detail.group(1).strip() if detail else _first_line(e)})")


def _checked_path(path) -> Path:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint not found")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory; give the checkpoint file (e.g. {path}/checkpoint_best.pt)")
    return path


def read_state(path) -> dict:
    """The checkpoint's dict, read with ``weights_only=True`` and the plugin's allowlist; ``cfg``
    as an OmegaConf object and old layouts upgraded, as fairseq's ``load_checkpoint_to_cpu`` does."""
    path = _checked_path(path)
    fairseq_compat.allow_fairseq_checkpoints()  # the allowlist is this loader's safety policy
    if not hasattr(torch.serialization, "add_safe_globals"):  # no allowlist to extend: never load unchecked
        raise CheckpointError(f"{path}: loading checkpoints safely (weights_only=True with an allowlist) needs "
                              f"torch >= 2.4, found {torch.__version__}")
    try:
        with open(path, "rb") as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise _refusal(path, e) from None
    except Exception as e:  # zip, EOF and storage errors: not a (complete) checkpoint
        raise CheckpointError(f"{path}: cannot load the checkpoint ({_first_line(e)})") from None
    if not isinstance(state, dict) or "model" not in state or (state.get("cfg") is None and state.get("args") is None):
        raise CheckpointError(f"{path}: not a fairseq checkpoint (no 'cfg' and 'model' entries)")
    try:
        return _as_fairseq_state(state)
    except (KeyError, AttributeError, TypeError, ValueError) as e:  # a layout fairseq cannot upgrade
        raise CheckpointError(f"{path}: not a fairseq checkpoint ({type(e).__name__}: {_first_line(e)})") from None


def _as_fairseq_state(state: dict) -> dict:
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    if state.get("cfg") is not None:
        state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
    return checkpoint_utils._upgrade_state_dict(state)


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    arch: str
    task: str
    parameters: int   # model weights, without fairseq's one-element ``_float_tensor`` buffers
    updates: int


def checkpoint_info(path) -> CheckpointInfo:
    """Parameter count, updates and architecture (for tables), without building the model."""
    state = read_state(path)
    cfg = config_of(state)
    history = state.get("optimizer_history") or [{}]
    return CheckpointInfo(
        path=str(path), arch=str(_get(cfg.model, "arch") or _get(cfg.model, "_name", "?")),
        task=str(_get(cfg.task, "_name", "?")),
        parameters=sum(v.numel() for k, v in state["model"].items() if not k.endswith("_float_tensor")),
        updates=int(history[-1].get("num_updates", 0)))


def config_of(state: dict):
    """The checkpoint's config; an old argparse checkpoint converted as fairseq does."""
    if state.get("args") is not None:
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        return convert_namespace_to_omegaconf(state["args"])
    return state["cfg"]


def _get(obj, key, default=None):
    """A config value from a DictConfig or an argparse Namespace (fairseq stores either)."""
    value = getattr(obj, key, None) if obj is not None else None
    return default if value is None else value


# ---------------------------------------------------------------- resources

def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CheckpointError(f"--device {device}: CUDA is not available on this machine; use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise CheckpointError(f"--device: expected cpu, cuda, cuda:N or auto, got {device!r}")
    return device


def _check_known(path: Path, cfg) -> None:
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    arch = _get(cfg.model, "arch") or _get(cfg.model, "_name")
    if arch not in ARCH_MODEL_REGISTRY and arch not in MODEL_REGISTRY:
        ours = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if a.startswith("reluformer"))
        if not ours:  # the loader sits below the plugin: the entry point registers (the CLIs, the translator)
            raise CheckpointError(f"{path}: architecture {arch!r} is not registered with fairseq: call "
                                  "reluformer_mt.register() before loading a checkpoint in your own code")
        raise CheckpointError(f"{path}: architecture {arch!r} is not known to fairseq or reluformer_mt "
                              f"(reluformer architectures: {', '.join(ours[:6])}, ...); was it trained with another plugin?")
    task = _get(cfg.task, "_name")
    if task not in TASK_REGISTRY:
        raise CheckpointError(f"{path}: task {task!r} is not known to fairseq or reluformer_mt")


@dataclass(frozen=True)
class DataDir:
    """Where a checkpoint's dictionaries were found, with the languages and prepared.json there."""
    path: Path
    src_lang: str
    tgt_lang: str
    prepared: Optional[Prepared]
    looked_in: List[str]


def find_data_dir(checkpoint: Path, cfg, data=None) -> DataDir:
    """``data`` if given, else the checkpoint's folder, then its stored ``task.data``: the first
    directory with both dictionaries (languages from the config, prepared.json or file names)."""
    if data is not None:
        if not Path(data).is_dir():
            raise CheckpointError(f"--data {data}: directory not found")
        candidates = [Path(data)]
    else:
        stored = _stored_data(cfg)
        candidates = [checkpoint.parent] + ([stored] if stored else [])
    looked = [str(c) for c in candidates]
    src, tgt = _get(cfg.task, "source_lang"), _get(cfg.task, "target_lang")
    for directory in candidates:
        prepared = Prepared.load_if_present(directory) if directory.is_dir() else None
        s, t = src or (prepared and prepared.src_lang), tgt or (prepared and prepared.tgt_lang)
        if not (s and t) and directory.is_dir():
            from fairseq.data.data_utils import infer_language_pair

            s, t = infer_language_pair(str(directory))  # from fairseq's train.SRC-TGT.* file names
        if s and t and (directory / f"dict.{s}.txt").is_file() and (directory / f"dict.{t}.txt").is_file():
            return DataDir(directory, s, t, prepared, looked)
    langs = (f"dict.{src}.txt and dict.{tgt}.txt" if src and tgt else
             f"the dictionaries and {PREPARED_NAME} (which names the languages)")
    raise CheckpointError(f"{checkpoint}: cannot find its resources: missing {langs} (looked in {', '.join(looked)}); "
                          "give --data DIR, the directory prepared by reluformer-prepare")


def sentencepiece_for(data: DataDir, spm_models=None, separator: Optional[str] = None):
    """(source, target) processors: ``spm_models`` (the ``--spm-model`` syntax) if given, else the
    prepared directory's, else (None, None) (word-level data: one token per word)."""
    paths = parse_spm_models(spm_models)
    if paths:
        try:
            return load_sentencepiece(paths, separator)
        except (ValueError, FileNotFoundError) as e:  # name the option the file came from
            raise type(e)(str(e) if str(e).startswith("--spm-model") else f"--spm-model {e}") from None
    if data.prepared is None:
        return None, None
    return data.prepared.sentencepiece(check_separator=separator is not None)


# ---------------------------------------------------------------- the model

@dataclass
class LoadedModel:
    """A checkpoint ready for inference (eval mode, on ``device``)."""
    path: str
    model: torch.nn.Module
    task: object
    cfg: object
    data_dir: str
    prepared: Optional[Prepared] = None
    spm_src: Optional[object] = None  # SentencePieceProcessor, or None for a word-level dictionary
    spm_tgt: Optional[object] = None
    device: str = "cpu"
    modules: Dict[str, List[torch.nn.Module]] = field(default_factory=dict)  # kind -> per-layer modules
    src_lang: str = ""
    tgt_lang: str = ""
    separator: str = SEPARATOR

    @property
    def src_dict(self):
        return self.task.source_dictionary

    @property
    def tgt_dict(self):
        return self.task.target_dictionary

    @property
    def n_layers(self) -> Dict[str, int]:
        return {k: len(v) for k, v in self.modules.items()}

    def describe(self) -> dict:
        fns = {k: sorted({m.fn for m in mods}) for k, mods in self.modules.items()}
        return {"checkpoint": self.path, "data": self.data_dir, "arch": getattr(self.cfg.model, "arch", "?"),
                "attention_functions": {k: "/".join(v) for k, v in fns.items()},
                "layers": self.n_layers, "heads": {k: mods[0].num_heads for k, mods in self.modules.items() if mods},
                "tokens": "sentencepiece" if self.spm_src is not None else "words"}


def attention_modules(model) -> Dict[str, List[torch.nn.Module]]:
    """kind -> ``ReluformerAttention`` modules ordered by layer, from their names
    (``encoder.layers.3.self_attn``, ``decoder.layers.0.encoder_attn``)."""
    from reluformer_mt.attention.multihead import ReluformerAttention

    found: Dict[str, Dict[int, torch.nn.Module]] = {k: {} for k in KINDS}
    for name, module in model.named_modules():
        if not isinstance(module, ReluformerAttention):
            continue
        parts = name.split(".")
        if "layers" not in parts:
            continue
        at = parts.index("layers")
        stack, layer, suffix = parts[at - 1] if at else "", int(parts[at + 1]), parts[-1]
        for kind in KINDS:
            if stack == _MODULE_STACK[kind] and suffix == _MODULE_SUFFIX[kind]:
                found[kind][layer] = module
    return {k: [v[i] for i in sorted(v)] for k, v in found.items()}


@dataclass
class OpenedCheckpoint:
    """A checkpoint read and checked, its data directory found; :meth:`load` builds the model.
    Tools with resource checks of their own (the translator) make them between the two steps."""
    path: Path
    state: dict
    data: DataDir

    @property
    def cfg(self):
        return self.state["cfg"]

    @property
    def separator(self) -> str:
        """The segment separator: prepared.json's, else the task's, else the package default."""
        if self.data.prepared is not None:
            return self.data.prepared.separator
        return _get(self.cfg.task, "separator") or SEPARATOR

    def load(self, device: str = "cpu", spm_models=None, need_attention: bool = False, check_separator: bool = False,
             quiet: bool = True, decoding: Optional[Dict[str, object]] = None) -> "LoadedModel":
        """The model on ``device`` with its SentencePiece processors (``spm_models``, the
        ``--spm-model`` syntax, else prepared.json's; None for word-level data; with
        ``check_separator`` each must encode the separator as one piece) and attention modules.
        ``need_attention``: refuse a model without ``ReluformerAttention`` cross-attention.
        ``decoding``: model options that only decoding reads (``memory_cache``), given to the
        model's config before it is built."""
        device = pick_device(device)
        spm_src, spm_tgt = sentencepiece_for(self.data, spm_models, self.separator if check_separator else None)
        _run_triton_elsewhere(self.path, self.state, device)
        model, cfg, task = _build(self.path, self.state, self.data, quiet, decoding or {})
        model = model.to(device).eval()
        modules = attention_modules(model)
        if need_attention and not modules["cross"]:
            raise CheckpointError(f"{self.path}: the model has no ReluformerAttention cross-attention; "
                                  f"train it with --arch reluformer or one of its architectures")
        return LoadedModel(path=str(self.path), model=model, task=task, cfg=cfg, data_dir=str(self.data.path),
                           prepared=self.data.prepared, spm_src=spm_src, spm_tgt=spm_tgt, device=device,
                           modules=modules, src_lang=self.data.src_lang, tgt_lang=self.data.tgt_lang,
                           separator=self.separator)


def _run_triton_elsewhere(path: Path, state: dict, device: str) -> None:
    """A model trained with --attn-impl triton (CUDA only) loaded on another device: its attention
    takes the default route (the same function, computed by another kernel), said once, instead of
    a RuntimeError in its first forward."""
    from omegaconf import open_dict

    model_cfgs = [state["cfg"].model] + ([state["args"]] if state.get("args") is not None else [])
    if device.startswith("cuda") or not any(_get(m, "attn_impl") == "triton" for m in model_cfgs):
        return
    for m in model_cfgs:
        if isinstance(m, argparse.Namespace):
            m.attn_impl = "auto"
        else:
            with open_dict(m):
                m.attn_impl = "auto"
    logging.getLogger(__name__).warning(
        "%s was trained with --attn-impl triton, which runs on CUDA only: on %s its attention runs the default "
        "route (--attn-impl auto; the same weights and function)", path, device)


def trained_vocabulary(opened: "OpenedCheckpoint"):
    """:func:`recorded_vocabulary` of an opened checkpoint."""
    return recorded_vocabulary(opened.path, opened.cfg)


def recorded_vocabulary(path, cfg):
    """The vocabulary (:class:`reluformer_mt.data.vocabulary.Vocabulary`) the checkpoint at
    ``path`` was trained with: that of the data directory its configuration records
    (``task.data``), else of the dictionaries beside it; None when neither is found from the
    current folder."""
    from reluformer_mt.data.vocabulary import vocabulary_of

    path = Path(path)
    for directory in (_stored_data(cfg), path.parent):
        if directory is not None and directory.is_dir():
            try:
                found = find_data_dir(path, cfg, directory)
            except CheckpointError:  # no dictionaries there
                continue
            return vocabulary_of(found.path, found.src_lang, found.tgt_lang)
    return None


def _stored_data(cfg) -> Optional[Path]:
    stored = str(_get(cfg.task, "data", "") or "").split(":")[0]
    return Path(stored) if stored else None


def is_recorded_data(directory, cfg) -> bool:
    """Whether ``directory`` is the training data the configuration records by a relative path
    (``task.data``) that does not resolve from the current folder: its resolved path ends with the
    recorded one (a run's folder addressed from elsewhere, as the rekey of a demo run does)."""
    stored = _stored_data(cfg)
    if stored is None or stored.is_absolute() or not Path(directory).is_dir():
        return False
    recorded = [part for part in stored.parts if part not in (".", "")]
    if not recorded or ".." in recorded:
        return False
    return list(Path(directory).resolve().parts[-len(recorded):]) == recorded


def _not_found(opened: "OpenedCheckpoint") -> str:
    """Why a checkpoint's own vocabulary cannot be found, and what to do."""
    src, tgt = opened.data.src_lang, opened.data.tgt_lang
    return (f"the training data it records ({_stored_data(opened.cfg) or 'none'}) is not found from {Path.cwd()} and "
            f"no dict.{src}.txt / dict.{tgt}.txt lie beside it; run from the folder it was trained in, or copy its "
            "dictionaries (and prepared.json with its SentencePiece model) beside the checkpoint")


def check_data_vocabulary(opened: "OpenedCheckpoint", option: str = "--data") -> None:
    """Refuse a data directory (``option``, the one ``opened`` was opened with) whose dictionaries
    or SentencePiece models are not the checkpoint's (:func:`trained_vocabulary`), compared by
    content; and one whose check cannot be made (the checkpoint's own vocabulary not found):
    never combine the model with data on faith."""
    from reluformer_mt.data.vocabulary import VocabularyError, check_same_vocabulary, vocabulary_of

    data = opened.data
    reference = trained_vocabulary(opened)
    if reference is None and is_recorded_data(data.path, opened.cfg):
        return  # the very training data it records, given by a path that works from here
    if reference is None:
        raise VocabularyError(f"{option} {data.path}: cannot check that it holds the vocabulary of {opened.path}: "
                              + _not_found(opened))
    check_same_vocabulary(reference, vocabulary_of(data.path, data.src_lang, data.tgt_lang), f"{option} {data.path}",
                          f"the checkpoint {opened.path}")


def check_ensemble_vocabulary(opened: List["OpenedCheckpoint"], data_given: bool) -> None:
    """The models of an ensemble share one vocabulary, each compared by what it was trained with
    (:func:`trained_vocabulary`): refused when they differ or when a member's cannot be found; with
    ``data_given``, --data (their resources) must hold the first one's too, when it is found."""
    from reluformer_mt.data.vocabulary import VocabularyError, check_same_vocabulary, vocabulary_of

    first = opened[0]
    reference = trained_vocabulary(first)
    if data_given and reference is not None:
        check_same_vocabulary(reference, vocabulary_of(first.data.path, first.data.src_lang, first.data.tgt_lang),
                              f"--data {first.data.path}", f"the checkpoint {first.path}")
    if reference is None:  # --data holds the first one's resources: the others must match them
        reference = vocabulary_of(first.data.path, first.data.src_lang, first.data.tgt_lang)
    for other in opened[1:]:
        theirs = trained_vocabulary(other)
        if theirs is None:
            raise VocabularyError(f"--checkpoint {other.path}: cannot check that it shares the vocabulary of "
                                  f"{first.path}: " + _not_found(other))
        check_same_vocabulary(reference, theirs, f"--checkpoint {other.path}", f"the checkpoint {first.path}",
                              remedy="models combined need one vocabulary")


def open_checkpoint(path, data=None) -> OpenedCheckpoint:
    """Read ``path`` (the one weights_only policy), check that fairseq knows its architecture and
    task, and find its data directory (``data``, else beside it, else where it was trained)."""
    path = Path(path)
    state = read_state(path)
    if state.get("cfg") is None:
        state["cfg"] = config_of(state)
    _check_known(path, state["cfg"])
    return OpenedCheckpoint(path, state, find_data_dir(path, state["cfg"], data))


def load_model(path, data=None, spm_models=None, device: str = "cpu", need_attention: bool = False,
               check_separator: bool = False, quiet: bool = True, check_data: bool = False) -> "LoadedModel":
    """:func:`open_checkpoint` then :meth:`OpenedCheckpoint.load`: what every tool calls. With
    ``check_data``, a ``data`` directory given is first checked to hold the checkpoint's vocabulary
    (:func:`check_data_vocabulary`): for tools that read the data's token ids with the model."""
    opened = open_checkpoint(path, data)
    if check_data and data is not None:
        check_data_vocabulary(opened)
    return opened.load(device, spm_models, need_attention, check_separator, quiet)


def _build(path: Path, state: dict, data: DataDir, quiet: bool, decoding: Dict[str, object]):
    """fairseq's model and task from ``state``, pointed at ``data`` for inference, the model's
    config given the ``decoding`` options."""
    from fairseq import checkpoint_utils
    from omegaconf import open_dict

    cfg = state["cfg"]
    with open_dict(cfg):
        model = cfg.get("model")
        for name, value in decoding.items() if model is not None else ():
            setattr(model, name, value)  # a DictConfig or, in a config stored by fairseq's CLI, a Namespace
        cfg.task.data = str(data.path)
        # fairseq infers the pair from binarised train files, which a resource directory may lack
        cfg.task.source_lang, cfg.task.target_lang = data.src_lang, data.tgt_lang
        if "eval_bleu" in cfg.task:
            cfg.task.eval_bleu = False  # validation-only machinery (tokenizers, its own generator)
    if state.get("args") is not None:  # an argparse-era checkpoint: fairseq reads its config from there
        state["args"].data, state["args"].eval_bleu = str(data.path), False
        state["args"].source_lang, state["args"].target_lang = data.src_lang, data.tgt_lang
        vars(state["args"]).update(decoding)
    level = logging.getLogger("fairseq").level
    if quiet:
        logging.getLogger("fairseq").setLevel(logging.WARNING)
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], state=state)
    except Exception as e:  # fairseq raises bare Exceptions too; any of them means "cannot build"
        raise CheckpointError(f"{path}: cannot build the model ({_first_line(e)})") from None
    finally:
        logging.getLogger("fairseq").setLevel(level)
    return models[0], cfg, task
