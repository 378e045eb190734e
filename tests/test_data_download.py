"""Download helpers with --local (no network here): copies are sha256-checked."""
import os
import shutil
from pathlib import Path

import pytest

from reluformer_mt.data import download

SHARED = Path(os.environ.get("RELUFORMER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
pytestmark = pytest.mark.skipif(not (SHARED / "docmt_ende").is_dir(), reason=f"shared data not found at {SHARED}")


def test_local_copy_verified_and_rerun_is_noop(tmp_path, capsys):
    assert download.main(["docmt_ende", "iwslt17_ted_test", "--dest", str(tmp_path), "--local", str(SHARED)]) == 0
    assert (tmp_path / "docmt_ende/NC-2016/concatenated_en2de_test_de.txt").is_file()
    assert (tmp_path / "iwslt17_ted_test/en-de/IWSLT17.TED.tst2017.en-de.en.xml").is_file()
    assert "no training sets" in capsys.readouterr().out
    assert download.get_docmt(tmp_path, str(SHARED), log=lambda m: None) == 0  # all present and checked


def test_checksum_mismatch_is_an_error(tmp_path, capsys):
    local = tmp_path / "local"
    for rel in download.DOCMT:  # copyfile: writable copies of the read-only shared files
        (local / "docmt_ende" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHARED / "docmt_ende" / rel, local / "docmt_ende" / rel)
    bad = local / "docmt_ende/IWSLT2017/concatenated_en2de_dev_en.txt"
    bad.write_bytes(bad.read_bytes() + b"extra\n")
    assert download.main(["docmt_ende", "--dest", str(tmp_path / "out"), "--local", str(local)]) == 2
    assert "concatenated_en2de_dev_en.txt: sha256" in capsys.readouterr().err
