"""The translation report names what ran the memory readers' and the kNN-MT steps: the C++ loops
(AVX-512, AVX2 or portable) and the memory cache's dtype, including memories kept in float32
because float16 could not hold them; before, a user could not tell what produced a translation."""
import pytest
import torch

from helpers import USER_DIR, needs_shared_data, run_fairseq
from test_hardening_loading import datastore, source_file  # noqa: F401 (fixture: an exact datastore)
from test_translate import FAST, translate_main
from test_translation_memory import TRAIN_TM, memory_data  # noqa: F401 (fixture: a directory prepared with --memory-k 4)

from reluformer_mt.knn import fused as knn_fused
from reluformer_mt.memory import fused as memory_fused

LOOPS = ("AVX-512", "AVX2", "portable")


@pytest.fixture(scope="module")
def softmax_reader_checkpoint(memory_data, tmp_path_factory):  # noqa: F811
    save = tmp_path_factory.mktemp("softmax_reader")
    run_fairseq("train", [memory_data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_TM,
                          "--tm-fusion", "attention", "--tm-k", "2", "--tm-attn-fn", "softmax", "--save-dir", save])
    return save / "checkpoint_last.pt"


@needs_shared_data
@pytest.mark.skipif(memory_fused.KERNEL.load() is None, reason="C++ kernel not buildable here")
@pytest.mark.parametrize("cache", ["float16", "float32"])
def test_the_summary_names_the_memory_steps_loops_and_cache(cache, softmax_reader_checkpoint, memory_data):  # noqa: F811
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.memory.tm import read_prepared

    translator = DocumentTranslator(softmax_reader_checkpoint, beam=2, max_len_a=0, max_len_b=4, memory_cache=cache)
    translator.translate([read_prepared(memory_data, "test").sources[:3]])
    loops = memory_fused.KERNEL.module.cpu_loops()
    assert loops in LOOPS
    assert translator.kernels_used() == [f"memory step: C++ {loops} loops, cache {cache}"]


@needs_shared_data
@pytest.mark.skipif(memory_fused.KERNEL.load() is None, reason="C++ kernel not buildable here")
def test_the_summary_counts_memories_kept_in_float32(softmax_reader_checkpoint, memory_data):  # noqa: F811
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.memory.tm import read_prepared
    from reluformer_mt.memory.tm_attention import MemoryReader

    translator = DocumentTranslator(softmax_reader_checkpoint, beam=2, max_len_a=0, max_len_b=4)
    reader = next(r for r in translator.model.modules() if isinstance(r, MemoryReader))
    with torch.no_grad():  # the reader's keys and values beyond float16's +-65504
        reader.attn.k_proj.weight.mul_(1e6)
        reader.attn.v_proj.weight.mul_(1e6)
    translator.translate([read_prepared(memory_data, "test").sources[:2]])
    assert reader.cache_fallbacks > 0
    assert "memories kept in float32: beyond float16's range)" in translator.kernels_used()[0]


@needs_shared_data
@pytest.mark.skipif(knn_fused.KERNEL.load() is None, reason="C++ kernel not buildable here")
def test_the_printed_report_names_the_knn_steps_loops(datastore, doc_checkpoint, tmp_path, capsys):  # noqa: F811
    code, err = translate_main(["--checkpoint", doc_checkpoint, "--input", source_file(tmp_path), "--output",
                                tmp_path / "out.txt", "--knn", datastore, *FAST], capsys)
    assert code == 0, err
    loops = knn_fused.KERNEL.module.cpu_loops()
    assert loops in LOOPS[1:] and f"kNN-MT step: C++ {loops} loops" in err
    assert "memory step" not in err  # no memory reader in this model


@needs_shared_data
def test_the_report_says_pytorch_where_the_knn_kernel_did_not_run(datastore, doc_checkpoint, tmp_path, capsys,  # noqa: F811
                                                                  monkeypatch):
    monkeypatch.setattr(knn_fused, "available", lambda *tensors: False)  # as on CUDA or without a compiler
    code, err = translate_main(["--checkpoint", doc_checkpoint, "--input", source_file(tmp_path), "--output",
                                tmp_path / "out.txt", "--knn", datastore, *FAST], capsys)
    assert code == 0, err
    assert "kNN-MT step: PyTorch" in err and "kNN-MT step: C++" not in err
