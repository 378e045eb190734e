"""The training configuration a fairseq checkpoint stores, read without torch, so that a console
script can check where the checkpoint's resources are (``task.data``) before torch and fairseq
load (seconds). fairseq saves ``cfg`` as plain dicts and lists; everything else in the file
(tensors, storages, numpy values, optimizer state) is replaced by an inert placeholder: no class
or function named in the file is looked up or run, so reading an untrusted file is harmless; a
file naming types of other libraries is not read (the loader refuses it). The loader proper (``reluformer_mt.checkpoints``) still reads the checkpoint with torch's
``weights_only`` policy afterwards.
"""
import pickle
import zipfile
from collections import OrderedDict
from typing import Optional


class _Inert:
    """What stands for every global the pickle names (a tensor rebuilder, a storage class...)."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


# the libraries whose types a fairseq checkpoint holds; a file naming any other is left to the
# loader, whose allowlist refuses it with its own message
_ORDINARY = ("torch", "collections", "numpy", "argparse", "omegaconf", "enum", "typing")


class _ConfigUnpickler(pickle.Unpickler):
    foreign = False

    def find_class(self, module, name):
        self.foreign = self.foreign or module.split(".")[0] not in _ORDINARY
        return OrderedDict if (module, name) == ("collections", "OrderedDict") else _Inert

    def persistent_load(self, pid):  # torch's storages live outside the pickle
        return None


def stored_config(path) -> Optional[dict]:
    """The checkpoint's ``cfg`` as dicts, or None when it cannot be read this way (an old
    pickle-format file, ``args`` instead of ``cfg``, a damaged file: the loader says what is wrong)."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1)
            with archive.open(name) as f:
                unpickler = _ConfigUnpickler(f)
                state = unpickler.load()
    except Exception:  # anything unreadable here is left to the loader, which names the problem
        return None
    cfg = state.get("cfg") if isinstance(state, dict) and not unpickler.foreign else None
    return cfg if isinstance(cfg, dict) else None


def check_resources_findable(checkpoint) -> None:
    """Without --data the loader looks for the dictionaries beside the checkpoint, then in the
    stored ``task.data`` (relative to the current folder when training gave it so): refuse now
    when neither folder has any, as the loader would after loading torch and fairseq."""
    from pathlib import Path

    from reluformer_mt.data.prepared import PREPARED_NAME

    cfg = stored_config(checkpoint)
    if cfg is None:
        return
    task = cfg.get("task") or {}
    stored = str(task.get("data") or "").split(":")[0]
    folders = [Path(checkpoint).parent] + ([Path(stored)] if stored else [])
    src, tgt = task.get("source_lang"), task.get("target_lang")
    wanted = [f"dict.{src}.txt", f"dict.{tgt}.txt"] if src and tgt else None

    def has_resources(folder: Path) -> bool:
        if wanted:
            return all((folder / name).is_file() for name in wanted)
        return (folder / PREPARED_NAME).is_file() or any(folder.glob("dict.*.txt"))

    if not any(folder.is_dir() and has_resources(folder) for folder in folders):
        missing = " and ".join(wanted) if wanted else f"the dictionaries and {PREPARED_NAME} (which names the languages)"
        raise ValueError(f"{checkpoint}: cannot find its resources: missing {missing} (looked in "
                         f"{', '.join(map(str, folders))}); give --data DIR, the directory prepared by reluformer-prepare")
