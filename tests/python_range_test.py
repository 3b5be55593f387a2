"""The Pythons the project supports, declared once (pyproject.toml's
requires-python) and enforced by the README's install command: its
requirements file starts with this project's metadata (install/
metadata_only.py), so pip on another Python stops there with one line
naming that Python and the supported ones. pip runs for real, offline; the
refusal is shown with a copy whose range leaves out the Python running the
tests (the only one here), the acceptance with the real file."""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.specifiers import SpecifierSet
from run_helpers import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "install"))

import metadata_only  # noqa: E402

SUPPORTED = ("3.11", "3.12", "3.13")


def pip(command: str, *args: str, cwd) -> subprocess.CompletedProcess:
    """pip `command` of this Python, offline (no index: the project's build
    backend needs nothing from one)."""
    return subprocess.run(
        [sys.executable, "-m", "pip", command, "--no-index", *args]
        + ["--disable-pip-version-check"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_supported_pythons_are_3_11_to_3_13_and_readme_says_so():
    fields = metadata_only.project_fields()
    assert fields["name"] == "scalable-agent"
    allowed = SpecifierSet(fields["requires-python"])
    for version in ("3.10.12", "3.14.0", "2.7.18"):
        assert version not in allowed
    for minor in SUPPORTED:
        assert f"{minor}.0" in allowed and f"{minor}.9" in allowed
    # The backend's own reading of the range (packaging is not importable
    # where it runs) agrees with packaging's.
    for version in ((3, 10, 12), (3, 11, 0), (3, 12, 5), (3, 13, 9), (3, 14, 0)):
        assert metadata_only.python_supported(fields["requires-python"], version) == (
            ".".join(map(str, version)) in allowed
        )
    assert metadata_only.supported(fields["requires-python"]) == "3.11 to 3.13"
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        assert "Python 3.11, 3.12 or 3.13" in f.read()
    # The install command's first requirement is this project.
    with open(os.path.join(REPO_ROOT, "requirements.txt")) as f:
        lines = [line.split("#")[0].strip() for line in f]
    assert [line for line in lines if line][0] == "."


def test_pip_accepts_this_python_and_installs_metadata_only(tmp_path):
    result = pip("install", "--dry-run", "--no-deps", ".", cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Would install scalable-agent-0" in result.stdout
    # The wheel holds the metadata and nothing else.
    built = pip("wheel", "--no-deps", "-w", str(tmp_path), ".", cwd=REPO_ROOT)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = os.listdir(tmp_path)
    names = zipfile.ZipFile(tmp_path / wheel).namelist()
    assert sorted(names) == [
        "scalable_agent-0.dist-info/METADATA",
        "scalable_agent-0.dist-info/RECORD",
        "scalable_agent-0.dist-info/WHEEL",
    ]


@pytest.mark.parametrize("bound", ["above", "below"])
def test_another_python_stops_the_install_with_one_line(tmp_path, bound):
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    ranged = {
        "above": f">={sys.version_info.major}.{sys.version_info.minor + 1}",
        "below": f"<{here}",
    }[bound]
    copy = tmp_path / "project"
    copy.mkdir()
    shutil.copytree(os.path.join(REPO_ROOT, "install"), copy / "install")
    with open(os.path.join(REPO_ROOT, "pyproject.toml")) as f:
        text = f.read()
    text, count = re.subn(
        r'^requires-python = "[^"]*"', f'requires-python = "{ranged}"', text, flags=re.M
    )
    assert count == 1
    (copy / "pyproject.toml").write_text(text)
    # The requirements file as the README runs it, from the project's root.
    shutil.copy(os.path.join(REPO_ROOT, "requirements.txt"), copy)
    # As on a fresh Python: nothing installed counts, no index, no
    # configured wheel folder; a pinned package looked for would fail.
    options = ("--isolated", "--dry-run", "--ignore-installed")
    result = pip("install", *options, "-r", "requirements.txt", cwd=copy)
    # pip stops at the project's metadata, its first requirement, with the
    # backend's one line (in pip's frame for a failed build step).
    assert result.returncode == 1, result.stdout + result.stderr
    output = result.stdout + result.stderr
    version = ".".join(map(str, sys.version_info[:3]))
    ours = [line.strip() for line in output.splitlines() if "supports Python" in line]
    assert ours == [
        f"scalable-agent supports Python {metadata_only.supported(ranged)} and this "
        f"is Python {version}: run pip with one of those (README.md, Install)"
    ], output
    # Before any pinned package was looked for (none can be found without
    # an index: that would be an error of its own, a resolver's).
    assert "tensorflow" not in output and "Could not find" not in output
