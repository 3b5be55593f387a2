"""Checks that a DeepMind Lab wheel is for this interpreter's Python.

Run by the Dockerfile before it installs the wheel from wheels/: pip would
refuse a wheel for another Python with "is not a supported wheel on this
platform" and say nothing of which Python either side has. This names both
and the fix, in one line, and exits 1. A wheel's Python is the python tag of
its file name (PEP 427: name-version[-build]-python-abi-platform.whl):
`cp311` is CPython 3.11 only, `py3` any Python 3.

    python3 docker/wheel_python.py wheels/deepmind_lab-1.0-cp311-cp311-linux_x86_64.whl
"""

from __future__ import annotations

import os
import re
import sys


def wheel_pythons(filename: str) -> list[str]:
    """The python tags of a wheel file name (e.g. ['cp311'] or ['py2', 'py3'])."""
    name = os.path.basename(filename)
    parts = name.removesuffix(".whl").split("-")
    if not name.endswith(".whl") or len(parts) not in (5, 6):
        raise ValueError(f"{name} is not a wheel's file name")
    return parts[-3].split(".")


def fits(tag: str, version: tuple[int, int]) -> bool:
    """Whether python tag `tag` installs on CPython `version`."""
    major, minor = version
    return tag in (f"py{major}", f"py{major}{minor}", f"cp{major}{minor}")


def describe(tag: str) -> str:
    match = re.fullmatch(r"(?:cp|py)(\d)(\d+)", tag)
    return f"Python {match.group(1)}.{match.group(2)} ({tag})" if match else tag


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: wheel_python.py WHEEL", file=sys.stderr)
        return 2
    path = argv[1]
    version = sys.version_info[:2]
    try:
        tags = wheel_pythons(path)
    except ValueError as e:
        print(f"wheels/{os.path.basename(path)}: {e}", file=sys.stderr)
        return 1
    if any(fits(tag, version) for tag in tags):
        return 0
    here = f"{version[0]}.{version[1]}"
    print(
        f"wheels/{os.path.basename(path)} is for "
        f"{' or '.join(describe(t) for t in tags)}; this image has Python "
        f"{here}: bring a deepmind_lab wheel built for Python {here} "
        f"(cp{version[0]}{version[1]}), or pass --build-arg PYTHON_IMAGE=<an "
        "image with the wheel's Python> (docs/docker.md)",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
