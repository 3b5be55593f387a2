"""The build backend (PEP 517) of pyproject.toml's [project]: a wheel of
metadata only. `pip install -r requirements.txt`, whose first line is this
project, runs a hook of this backend before it looks up any pinned
package; on a Python outside requires-python the hook prints one line

    scalable-agent supports Python 3.11 to 3.13 and this is Python 3.10.12: ...

and exits 1, so pip stops there (inside its frame for a failed build step)
instead of ending in a resolver error about TensorFlow's wheels: pip looks
up the pinned requirements before it checks a local project's
Requires-Python, so that metadata alone cannot stop it first. The code is
not installed: it runs from the checkout. The backend needs nothing to
build (no setuptools to fetch) and runs on any Python 3 pip runs on, the
unsupported ones included: no tomllib (3.11+), so pyproject.toml's three
[project] strings it needs are read with a regular expression, and no
packaging, so requires-python's >= and < clauses are read here too.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sys
import zipfile

_HERE = os.path.dirname(os.path.abspath(__file__))
PYPROJECT = os.path.join(os.path.dirname(_HERE), "pyproject.toml")
_KEYS = ("name", "version", "requires-python")


def project_fields(path: str = PYPROJECT) -> dict:
    """{key: value} of _KEYS in pyproject.toml's [project] table (each a
    one-line string there)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    table = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if table is None:
        raise ValueError(f"{path}: no [project] table")
    fields = {}
    for key in _KEYS:
        match = re.search(rf'^{re.escape(key)}\s*=\s*"([^"]*)"', table.group(1), re.M)
        if match is None:
            raise ValueError(f'{path}: [project] has no {key} = "..."')
        fields[key] = match.group(1)
    return fields


def _dist_info(fields: dict) -> tuple[str, dict]:
    """The .dist-info directory's name and its files' text."""
    stem = f"{re.sub(r'[-_.]+', '_', fields['name'])}-{fields['version']}"
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {fields['name']}\n"
        f"Version: {fields['version']}\n"
        f"Requires-Python: {fields['requires-python']}\n"
    )
    wheel = (
        "Wheel-Version: 1.0\n"
        "Generator: install/metadata_only.py\n"
        "Root-Is-Purelib: true\n"
        "Tag: py3-none-any\n"
    )
    return f"{stem}.dist-info", {"METADATA": metadata, "WHEEL": wheel}


def _clauses(requires_python: str) -> list[tuple[str, tuple]]:
    """(operator, version) of each comma-separated clause of
    `requires_python`: >= and < only, all that pyproject.toml uses."""
    clauses = []
    for clause in requires_python.split(","):
        match = re.fullmatch(r"\s*(>=|<)\s*([0-9.]+)\s*", clause)
        if match is None:
            raise ValueError(f"requires-python clause {clause!r}: only >= and <")
        bound = tuple(int(part) for part in match.group(2).split("."))
        clauses.append((match.group(1), bound))
    return clauses


def python_supported(requires_python: str, version: tuple) -> bool:
    """Whether `version` (sys.version_info's first numbers) meets
    `requires_python`."""
    for op, bound in _clauses(requires_python):
        given = tuple(version[: len(bound)])
        if (op == ">=" and given < bound) or (op == "<" and given >= bound):
            return False
    return True


def _refuse_other_pythons(fields: dict) -> None:
    """Ends the hook (and with it pip's install, before it looks for any
    pinned package) with one line, on a Python outside requires-python."""
    if python_supported(fields["requires-python"], sys.version_info[:3]):
        return
    here = ".".join(str(n) for n in sys.version_info[:3])
    print(
        f"{fields['name']} supports Python {supported(fields['requires-python'])} "
        f"and this is Python {here}: run pip with one of those (README.md, "
        f"Install)",
        file=sys.stderr,
    )
    raise SystemExit(1)


def supported(requires_python: str) -> str:
    """'3.11 to 3.13' for '>=3.11,<3.14'; the clauses as written otherwise."""
    bounds = dict(_clauses(requires_python))
    low, high = bounds.get(">="), bounds.get("<")
    if low and high and len(low) == len(high) == 2 and low[0] == high[0]:
        return f"{low[0]}.{low[1]} to {high[0]}.{high[1] - 1}"
    return requires_python


def get_requires_for_build_wheel(config_settings=None) -> list:
    _refuse_other_pythons(project_fields())
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    fields = project_fields()
    _refuse_other_pythons(fields)
    name, files = _dist_info(fields)
    os.makedirs(os.path.join(metadata_directory, name), exist_ok=True)
    for filename, text in files.items():
        with open(os.path.join(metadata_directory, name, filename), "w") as f:
            f.write(text)
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    fields = project_fields()
    _refuse_other_pythons(fields)
    name, files = _dist_info(fields)
    wheel_name = f"{name[: -len('.dist-info')]}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w") as wheel:
        for filename, text in files.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
            record.append(
                f"{name}/{filename},sha256={digest.rstrip(b'=').decode()},{len(data)}"
            )
            wheel.writestr(f"{name}/{filename}", data)
        record.append(f"{name}/RECORD,,")
        wheel.writestr(f"{name}/RECORD", "\n".join(record) + "\n")
    return wheel_name
