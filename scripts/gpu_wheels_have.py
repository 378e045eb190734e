#!/usr/bin/env python3
"""What the GPU machine already has, for ``scripts/gpu_wheels.sh DIR --have FILE`` (issue 32).

    python3 scripts/gpu_wheels_have.py FILE                      # check FILE, print how many packages it names
    python3 scripts/gpu_wheels_have.py FILE --prune DIR REQ ...  # delete from DIR the wheels the machine has

FILE is ``python3 -m pip list --format=freeze`` run on the GPU machine (``NAME==VERSION`` lines).
A wheel in DIR is deleted when FILE names its package at a version that satisfies every requirement
on it: the requirements REQ given (the wheel script's list) and the ``Requires-Dist`` of every wheel
left in DIR (markers evaluated for CPython 3.12 on Linux; wheels named in ``--no-deps`` are
installed without their requirements and do not count). Deleting a wheel drops its requirements, so
this repeats until nothing more goes. A package the machine has at a version that does not fit
keeps its wheel (pip then installs the folder's version into the check's venv).
"""
import argparse
import re
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:  # pip vendors it
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import InvalidVersion, Version

# the GPU machine: CPython 3.12 on x86_64 Linux (what the wheel script downloads for)
TARGET = {"python_version": "3.12", "python_full_version": "3.12.0", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
          "os_name": "posix", "platform_machine": "x86_64", "extra": ""}
FREEZE_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)\s*$")


def read_have(path: Path) -> dict:
    """{canonical name: Version} from a ``pip list --format=freeze`` file; a line that is not
    ``NAME==VERSION`` stops with one line naming it."""
    have = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = FREEZE_LINE.match(line)
        version = _version(match[2]) if match else None
        if version is None:
            sys.exit(f"gpu_wheels: --have {path} line {number}: expected NAME==VERSION, got {line!r} "
                     "(make the file with `python3 -m pip list --format=freeze` on the GPU machine)")
        have[canonicalize_name(match[1])] = version
    return have


def _version(text: str):
    try:
        return Version(text)
    except InvalidVersion:
        return None


def wheel_requirements(wheel: Path) -> list:
    """The wheel's ``Requires-Dist`` that apply on the target (extras not requested)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(metadata).decode("utf-8"))
    requirements = [Requirement(line) for line in message.get_all("Requires-Dist") or []]
    return [r for r in requirements if r.marker is None or r.marker.evaluate(TARGET)]


def wheel_name(wheel: Path) -> str:
    return canonicalize_name(wheel.name.split("-")[0])


def prune(folder: Path, have: dict, requirements: list, no_deps: set) -> list:
    """Delete the wheels the machine has at a fitting version; returns [(wheel, the machine's version)]."""
    wheels = {wheel_name(w): w for w in sorted(folder.glob("*.whl"))}
    needs = {name: ([] if name in no_deps else wheel_requirements(w)) for name, w in wheels.items()}
    removed = []
    while True:
        specifiers = {}
        for requirement in requirements + [r for name in wheels for r in needs[name]]:
            specifiers.setdefault(canonicalize_name(requirement.name), []).append(requirement.specifier)
        fits = [name for name in wheels if name in have
                and all(s.contains(have[name], prereleases=True) for s in specifiers.get(name, []))]
        if not fits:
            return removed
        for name in fits:
            wheels[name].unlink()
            removed.append((wheels.pop(name), have[name]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("have", type=Path, help="pip list --format=freeze of the GPU machine")
    parser.add_argument("--prune", type=Path, metavar="DIR", help="the wheel folder to prune")
    parser.add_argument("--no-deps", default="", help="comma-separated packages installed without their requirements")
    parser.add_argument("requirements", nargs="*", help="the wheel script's requirement list")
    args = parser.parse_intermixed_args(argv)  # FILE first, the requirements after the options
    if not args.have.is_file():
        sys.exit(f"gpu_wheels: --have {args.have}: no such file "
                 "(make it with `python3 -m pip list --format=freeze > FILE` on the GPU machine)")
    have = read_have(args.have)
    if args.prune is None:
        print(f"gpu_wheels: --have {args.have}: {len(have)} packages on the GPU machine")
        return
    requirements = [Requirement(r) for r in args.requirements]
    no_deps = {canonicalize_name(n) for n in args.no_deps.split(",") if n}
    for wheel, version in prune(args.prune, have, requirements, no_deps):
        print(f"gpu_wheels: the machine has {wheel_name(wheel)} {version}: dropped {wheel.name}")


if __name__ == "__main__":
    main()
