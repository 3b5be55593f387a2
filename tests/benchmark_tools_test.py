"""Tests of the benchmark scripts' own options (not of the figures they measure).

The benchmarks themselves take minutes and are run by hand (BENCHMARKS.md);
these tests cover only what their command lines promise and cost seconds.
"""

import os
import subprocess
import sys

from run_helpers import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))

import throughput_bench  # noqa: E402

SCRIPT = os.path.join(REPO_ROOT, "benchmarks", "throughput_bench.py")


def test_throughput_record_goes_where_json_says_else_to_the_committed_one(tmp_path):
    target = tmp_path / "round.json"
    assert throughput_bench.record_path("deep", str(target)) == str(target)
    assert throughput_bench.record_path("deep", None) == os.path.join(
        REPO_ROOT, "benchmarks", "results", "throughput_deep.json"
    )


def test_throughput_json_with_several_parts_is_refused_before_any_run(tmp_path):
    target = tmp_path / "round.json"
    result = subprocess.run(
        [sys.executable, SCRIPT, "--part=all", f"--json={target}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"--json={target}" in result.stderr
    assert "--part=all runs 4 parts" in result.stderr
    assert not target.exists()
