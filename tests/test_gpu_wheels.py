"""The GPU check on an offline machine (issue 32): ``scripts/gpu_wheels.sh``'s list covers every
package the check imports, and ``benchmarks/gpu_check.sh --dry-run`` / ``--wheels`` say what they
would do, or why they cannot, in one line (no network, no GPU needed)."""
import json
import os
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, requires

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from helpers import REPO

WHEELS = REPO / "scripts" / "gpu_wheels.sh"
CHECK = REPO / "benchmarks" / "gpu_check.sh"
# the machine's own (a stock CUDA image): torch, triton and what torch requires
STOCK = {"torch", "triton"}
# imported only when present (inside try/except ImportError): not needed on the GPU machine.
# Checked to import without them in a Python 3.12 environment made from the wheel folder.
OPTIONAL = {
    "pandas": "scikit-learn's array-API helpers", "python-dateutil": "pandas", "pytz": "pandas", "tzdata": "pandas",
    "psutil": "joblib's process pool", "cython": "scipy's test utilities", "charset-normalizer": "numpy.f2py",
    "wcwidth": "tabulate's wide characters", "attrs": "omegaconf's support of attrs classes",
}
# pinned wider for the GPU machine than in requirements.txt, and why
WIDER = {"numpy": "a machine's numpy 2.3/2.4 serves: the check and the kernel's tests ran with 2.4.6 (PERFORMANCE.md)",
         "pytest": "the CPU pin (< 9.2) is for pytest-xdist's worker groups in make test; the check runs pytest without them"}
# what imports them while the check runs: gpu_check.py's sections and, for section 1, pytest on the
# kernel's tests (conftest registers the plugin)
IMPORTS = f"""
import importlib.util, json, sys
sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'tests')!r}]
spec = importlib.util.spec_from_file_location("gpu_check", {str(REPO / 'benchmarks' / 'gpu_check.py')!r})
spec.loader.exec_module(importlib.util.module_from_spec(spec))
from reluformer_mt.plugin import register
register()
import fairseq.options, fairseq.data, fairseq.tasks.translation, fairseq.modules.multihead_attention
from reluformer_mt.attention import blocked, flex, triton_kernel, visibility, ReluformerAttention, record_attention
import pytest, conftest, helpers, test_triton_kernel
from importlib.metadata import packages_distributions
owners = packages_distributions()
# the checkout's own modules (benchmarks, tests) are not installed packages, whatever else shares their names
ours = {{name for name, m in list(sys.modules.items()) if (getattr(m, "__file__", None) or "").startswith({str(REPO)!r})}}
print(json.dumps(sorted({{d for name in list(sys.modules) if name.split(".")[0] not in ours
                         for d in owners.get(name.split(".")[0], [])}})))
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names, skip_deps_of=()) -> set:
    """The names and every requirement they have (markers evaluated for Python 3.12 on Linux)."""
    env = dict(default_environment(), python_version="3.12", python_full_version="3.12.0", sys_platform="linux",
               platform_system="Linux")
    seen, todo = set(), [canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in skip_deps_of:
            continue
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        for line in reqs:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(dict(env, extra="")):
                todo.append(canonical(req.name))
    return seen


def wheel_list():
    out = subprocess.run(["bash", str(WHEELS), "--list"], capture_output=True, text=True, check=True).stdout
    return [Requirement(line) for line in out.split("\n") if line.strip()]


def test_the_wheel_list_covers_every_import_of_the_check():
    imported = json.loads(subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, check=True,
                                         cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1")).stdout.splitlines()[-1])
    imported = {canonical(d) for d in imported} - {"reluformer-mt"}
    listed = [canonical(r.name) for r in wheel_list()]
    # ve-fairseq is installed without its requirements (torchaudio, cython, cffi: never imported)
    covered = closure(listed, skip_deps_of={"ve-fairseq"}) | closure(STOCK)
    missing = sorted(imported - covered - {canonical(n) for n in OPTIONAL})
    assert not missing, f"imported by the check, not in scripts/gpu_wheels.sh's list: {missing}"
    # and nothing of the project's that the check does not import rides along
    for heavy in ("faiss-cpu", "eflomal", "sentencepiece", "matplotlib", "torch", "triton"):
        assert heavy not in listed and heavy not in closure(listed, skip_deps_of={"ve-fairseq"}) - closure(STOCK), heavy
    # the pins agree with requirements.txt where both name a package
    pinned = {canonical(Requirement(l).name): Requirement(l).specifier
              for l in (REPO / "requirements.txt").read_text().splitlines() if l.strip() and not l.startswith("#")}
    for req in wheel_list():
        name = canonical(req.name)
        if name in WIDER:  # wider than the CPU pin, still admitting the version tested here
            assert req.specifier.contains(distribution(name).version) and str(req.specifier) != str(pinned[name]), req
        elif name in pinned and str(pinned[name]):
            assert str(req.specifier) == str(pinned[name]), req


def test_optional_imports_are_really_optional():
    """The packages the test above lets pass are not among what the listed packages require."""
    needed = closure([canonical(r.name) for r in wheel_list()], skip_deps_of={"ve-fairseq"})
    assert not needed & {canonical(n) for n in OPTIONAL}
    for name in OPTIONAL:  # still spelled as distributions are (a typo would make the exemption void)
        try:
            distribution(name)
        except PackageNotFoundError:
            pass


def run(cmd, **env):
    return subprocess.run(["bash", *map(str, cmd)], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, **env), timeout=120)


def test_dry_run_prints_the_plan_and_where_each_package_comes_from(tmp_path):
    for req in wheel_list():  # a fake wheel folder: names only
        (tmp_path / f"{canonical(req.name).replace('-', '_')}-1.0-py3-none-any.whl").write_bytes(b"x")
    done = run([CHECK, "--dry-run", "--wheels", tmp_path], PYTHON=sys.executable)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "gpu_check --dry-run: the plan (nothing is installed or run)"
    assert any(l.startswith("  python: ") and "torch" in l for l in lines)
    for req in wheel_list():
        assert any(l.startswith(f"  {req}") for l in lines), req
    assert f"wheel folder: {len(wheel_list())} wheels" in done.stdout
    # pip's verdict on the folder (names-only wheels: it fails on a 3.12 python, is not tried on another)
    assert any(l.startswith("  pip --dry-run --no-index: ") for l in lines)
    assert not (REPO / ".venv-gpu").exists() or (REPO / ".venv-gpu").stat().st_mtime < os.path.getmtime(CHECK)


@pytest.mark.parametrize("args, message", [
    (["--wheels", "/nonexistent"], "gpu_check: --wheels /nonexistent: no such folder"),
    (["--bogus"], "gpu_check: unknown option --bogus"),
    (["--wheels"], "gpu_check: --wheels needs a folder"),
])
def test_bad_arguments_are_one_line(args, message):
    done = run([CHECK, *args])
    assert done.returncode == 2 and done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr


def test_wheels_without_a_cuda_torch_stop_before_installing(tmp_path):
    (tmp_path / "x-1.0-py3-none-any.whl").write_bytes(b"x")
    done = run([CHECK, "--wheels", tmp_path], PYTHON=sys.executable)
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert done.returncode == 2 and done.stderr.startswith("gpu_check: --wheels needs a python with a CUDA torch")
    assert done.stderr.count("\n") == 1


def test_wheel_script_usage():
    done = run([WHEELS])
    assert done.returncode == 2 and done.stderr.startswith("usage: scripts/gpu_wheels.sh DIR")


def fake_wheel(folder, name, version, requires=()):
    """A wheel file holding only its METADATA (what the pruning reads)."""
    import zipfile

    path = folder / f"{name}-{version}-py3-none-any.whl"
    metadata = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n%s" % (
        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", metadata)
    return path


HAVE = REPO / "scripts" / "gpu_wheels_have.py"


def test_have_drops_exactly_the_wheels_the_machine_has_at_a_fitting_version(tmp_path):
    """--have: a package the machine has goes when its version fits every requirement on it (the
    list's and the remaining wheels'), which can free another one in a second round; a version that
    does not fit keeps its wheel; markers for other Pythons and extras do not count; a wheel installed
    without its requirements does not constrain."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    fake_wheel(folder, "alpha", "2.0", ["beta>=1.5", "gamma>=1.20", 'gamma<1.0; python_version < "3.10"',
                                        'delta>=9; extra == "test"'])
    fake_wheel(folder, "beta", "1.9", ["gamma>=1.23"])   # the machine's gamma 1.22 fits once beta is gone
    fake_wheel(folder, "gamma", "2.5")
    fake_wheel(folder, "delta", "1.0")                    # the machine's 0.5 is too old for the list
    fake_wheel(folder, "epsilon", "3.0", ["delta>=100"])  # installed --no-deps: its requirement is ignored
    fake_wheel(folder, "zeta", "1.0")                     # not on the machine
    have = tmp_path / "have.txt"
    have.write_text("# pip list --format=freeze\nBeta==1.6\ngamma==1.22\ndelta==0.5\nepsilon==3.1\ntorch==2.11.0\n")
    done = subprocess.run([sys.executable, str(HAVE), str(have), "--prune", str(folder), "--no-deps", "epsilon", "--",
                           "alpha>=1", "gamma<2.6", "delta>=0.9", "epsilon", "zeta"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    left = sorted(p.name.split("-")[0] for p in folder.glob("*.whl"))
    assert left == ["alpha", "delta", "zeta"], (left, done.stdout)
    assert "the machine has beta 1.6: dropped beta-1.9-py3-none-any.whl" in done.stdout
    assert "the machine has gamma 1.22" in done.stdout


@pytest.mark.parametrize("text, message", [
    ("numpy==2.2.6\nscipy @ file:///tmp/scipy.whl\n", "line 2: expected NAME==VERSION, got 'scipy @ file:///tmp/scipy.whl'"),
    ("numpy>=2\n", "line 1: expected NAME==VERSION"),
    ("numpy==not a version\n", "line 1: expected NAME==VERSION"),
])
def test_have_file_errors_are_one_line_before_any_download(tmp_path, text, message):
    have = tmp_path / "have.txt"
    have.write_text(text)
    folder = tmp_path / "wheels"
    done = run([WHEELS, folder, "--have", have], PYTHON=sys.executable)
    assert done.returncode != 0 and done.stderr.startswith(f"gpu_wheels: --have {have} {message}"), done.stderr
    assert done.stderr.count("\n") == 1 and not folder.exists()
    missing = run([WHEELS, folder, "--have", tmp_path / "nope.txt"], PYTHON=sys.executable)
    assert missing.returncode != 0 and missing.stderr.startswith(f"gpu_wheels: --have {tmp_path / 'nope.txt'}: no such file")
