"""Importing the package has no side effects; fairseq's --user-dir and register() register it."""
import subprocess
import sys

from helpers import USER_DIR

LIGHT = ["reluformer_mt", "reluformer_mt.data", "reluformer_mt.data.segments", "reluformer_mt.data.readers",
         "reluformer_mt.data.documents", "reluformer_mt.evaluation.aer", "reluformer_mt.evaluation.bleu"]


def python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_light_modules_load_neither_torch_nor_fairseq():
    out = python(f"import sys\nfor m in {LIGHT!r}: __import__(m)\n"
                 "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'fairseq', 'fairseq_cli'}))")
    assert out.strip() == "[]"


REGISTRIES = """
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.data import data_utils
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.tasks import TASK_REGISTRY
print('reluformer_cross_entropy' in CRITERION_REGISTRY, 'document_translation' in TASK_REGISTRY,
      'reluformer_tiny' in ARCH_MODEL_REGISTRY, getattr(data_utils.batch_by_size, '_reluformer_mt_patched', False))
"""


def test_user_dir_import_registers_everything_and_applies_the_fixes():
    out = python("import argparse\nfrom fairseq import utils\n"
                 f"utils.import_user_module(argparse.Namespace(user_dir={USER_DIR!r}))\n" + REGISTRIES)
    assert out.split() == ["True"] * 4


def test_after_a_light_import_register_is_the_explicit_way():
    # fairseq skips a --user-dir whose package is imported already: in-process callers register
    out = python("import argparse\nimport reluformer_mt.data.segments\nfrom fairseq import utils\n"
                 f"utils.import_user_module(argparse.Namespace(user_dir={USER_DIR!r}))\n" + REGISTRIES
                 + "import reluformer_mt\nreluformer_mt.register()\n" + REGISTRIES)
    first, second = out.strip().splitlines()
    assert first.split() == ["False"] * 4 and second.split() == ["True"] * 4
