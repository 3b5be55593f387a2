"""Packs the DeepMind Lab stand-in (tests/standin/deepmind_lab, a Python
module) as a wheel, for the Docker image's DeepMind Lab branch: the install
step, the level check at build time and the default run on the DeepMind Lab
path, without DeepMind Lab. Packing a Python module builds nothing of
DeepMind Lab. Never commit the wheel (.gitignore keeps wheels/*.whl out).

    python3 tests/standin_wheel.py wheels/
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import zipfile

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin")
NAME, VERSION = "deepmind_lab", "1.0+standin"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"{path},sha256={digest.decode()},{len(data)}"


def build_wheel(out_dir: str) -> str:
    """Writes the wheel into `out_dir`; returns its path."""
    info = f"{NAME}-{VERSION}.dist-info"
    files = {}
    package = os.path.join(STANDIN, NAME)
    for name in sorted(os.listdir(package)):
        if name.endswith(".py"):
            with open(os.path.join(package, name), "rb") as f:
                files[f"{NAME}/{name}"] = f.read()
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
        "Summary: The project's test stand-in for DeepMind Lab's Python module\n"
        "Requires-Dist: numpy\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests/standin_wheel.py\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [_record_line(path, data) for path, data in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{NAME}-{VERSION}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 tests/standin_wheel.py OUT_DIR")
    print(build_wheel(sys.argv[1]))
