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


def test_evaluation_data_copied_checked_and_usable(tmp_path, capsys):
    """Issue 33: DiscEvalMT, the gold alignments (awesome-align, Biçici) and ContraPro come through
    the same pinned copies, into the folders the evaluation commands read."""
    out = tmp_path / "data"
    names = ["discevalmt", "gold_align", "gold_align_deen", "contrapro"]
    assert download.main([*names, "--dest", str(out), "--local", str(SHARED)]) == 0
    printed = capsys.readouterr().out
    assert all(f"{name}: " in printed for name in names)
    for rel in ("bawden_enfr/anaphora.current.en", "gold_align_awesome/enfr.gold", "gold_align_awesome/zhen.gold",
                "gold_align_deen_bicici/de-en.wa", "gold_align_deen_bicici/test.en", "contrapro_ctx1/sentence_groups.txt"):
        assert (out / rel).is_file(), rel
    # the biçici files come out of the published zip, each checked
    assert (out / "gold_align_deen_bicici" / "test.de").read_bytes() == (SHARED / "gold_align_deen_bicici" / "test.de").read_bytes()
    from reluformer_mt.evaluation.contrastive import read_suite

    assert len(read_suite("discevalmt", out / "bawden_enfr")) == 400
    assert len(read_suite("contrapro", out / "contrapro_ctx1", limit=5)) == 5
    from reluformer_mt.evaluation import aer

    assert len(aer.read_gold(out / "gold_align_awesome" / "enfr.gold", base=1)) == 447
    # ContraPro is never downloaded (its text is OpenSubtitles'): without --local, one line saying how to get it
    assert download.main(["contrapro", "--dest", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not downloadable (OpenSubtitles text)" in err and "ZurichNLP/ContraPro" in err
    # a changed file is refused by name
    local = tmp_path / "local" / "bawden_enfr"
    local.mkdir(parents=True)
    for name in download.DISCEVALMT:
        shutil.copyfile(SHARED / "bawden_enfr" / name, local / name)
    (local / "anaphora.prev.fr").write_bytes(b"changed\n")
    assert download.main(["discevalmt", "--dest", str(tmp_path / "bad"), "--local", str(tmp_path / "local")]) == 2
    assert "anaphora.prev.fr: sha256" in capsys.readouterr().err


def test_fetch_downloads_over_http_with_the_pin(tmp_path):
    """The network path (pooch) against a local HTTP server serving the real shared files: a
    pinned file arrives, a wrong pin keeps nothing and names the file, a dead server names the URL."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SHARED))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        name, pin = "anaphora.current.en", download.DISCEVALMT["anaphora.current.en"][1]
        download.fetch(f"{base}/bawden_enfr/{name}", tmp_path / "ok" / name, pin)
        assert (tmp_path / "ok" / name).read_bytes() == (SHARED / "bawden_enfr" / name).read_bytes()
        with pytest.raises(ValueError, match=r"bad/anaphora.current.en: .*the file is damaged or the source changed"):
            download.fetch(f"{base}/bawden_enfr/{name}", tmp_path / "bad" / name, "0" * 64)
        assert not (tmp_path / "bad" / name).exists()
        with pytest.raises(OSError, match=r"/missing.txt: download failed .*--local DIR"):
            download.fetch(f"{base}/missing.txt", tmp_path / "gone" / "missing.txt", pin)
    finally:
        server.shutdown()
