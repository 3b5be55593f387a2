"""cpu_features: the bfloat16 warning, on given CPU flags (so the tests mean
the same on every machine), and in experiment.py's flag path."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
from run_helpers import REPO_ROOT, run_command_line

import experiment
from runtime import cpu_features

AVX2_ONLY = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})
AVX512_BF16 = AVX2_ONLY | {"avx512f", "avx512_bf16"}
AMX = AVX2_ONLY | {"avx512f", "amx_bf16", "amx_tile"}


def test_cpu_flags_reads_the_first_processor(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpu_features.cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_features.cpu_flags(str(tmp_path / "missing")) == frozenset()


@pytest.mark.parametrize(
    "torso_dtype, flags, warns",
    [
        ("bfloat16", AVX2_ONLY, True),
        ("bfloat16", AVX512_BF16, False),
        ("bfloat16", AMX, False),
        ("bfloat16", frozenset(), False),  # unknown CPU: no guess
        ("float32", AVX2_ONLY, False),
    ],
)
def test_bfloat16_warns_only_where_the_cpu_emulates_it(torso_dtype, flags, warns):
    warning = cpu_features.bfloat16_warning(torso_dtype, flags)
    assert (warning is not None) == warns
    if warns:
        assert warning.startswith("--torso_dtype=bfloat16: this CPU has no bfloat16")
        assert "--torso_dtype=float32" in warning


@pytest.mark.parametrize("flags, warns", [(AVX2_ONLY, True), (AVX512_BF16, False)])
def test_experiment_warns_once_for_emulated_bfloat16(
    flags, warns, monkeypatch, tmp_path
):
    """The flag path of a run, with the CPU's flags given: one warning line
    on a CPU without bfloat16 instructions, none on one with them (the run
    then stops at the flag error below, before anything is built)."""
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: flags)
    warnings = []
    monkeypatch.setattr(
        experiment.logging, "warning", lambda msg, *a: warnings.append(msg % a)
    )
    code = run_command_line(
        "--level_name=atari/pong",
        "--torso_dtype=bfloat16",
        "--mode=test",
        f"--logdir={tmp_path}",
    )
    assert code == 2  # no checkpoint to test
    ours = [w for w in warnings if w.startswith("--torso_dtype=bfloat16")]
    assert len(ours) == (1 if warns else 0), warnings


# -- oneDNN and the torso's dtype: fast settings chosen, never over the user's ---


def test_onednn_is_turned_on_on_x86_64_unless_the_user_chose():
    environ = {}
    line = cpu_features.default_onednn(environ, "x86_64")
    assert environ == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    assert "TF_ENABLE_ONEDNN_OPTS=0 turns them off" in line
    chosen = {"TF_ENABLE_ONEDNN_OPTS": "0"}
    assert cpu_features.default_onednn(chosen, "x86_64") is None
    assert chosen == {"TF_ENABLE_ONEDNN_OPTS": "0"}
    other = {}
    assert cpu_features.default_onednn(other, "aarch64") is None and other == {}


def test_experiment_turns_onednn_on_before_tensorflow():
    """As a user runs it (no TF_ENABLE_ONEDNN_OPTS): importing experiment.py
    sets the variable before TensorFlow is imported (TensorFlow's oneDNN is
    then on, whatever the CPU) and keeps the line the first log line adds."""
    from newcomer_test import user_environ

    if not cpu_features.is_x86_64(platform.machine()):
        pytest.skip("the project turns oneDNN on by default on x86-64 only")
    probe = (
        "import os, experiment, tensorflow;"
        "from tensorflow.python.util import _pywrap_util_port as port;"
        "print('SEEN', os.environ.get('TF_ENABLE_ONEDNN_OPTS'),"
        " port.IsMklEnabled(), bool(experiment.ONEDNN_CHOICE))"
    )
    # (The user's own value is kept: the unit test above, on default_onednn.)
    result = _run_python(probe, user_environ(), timeout=120)
    assert "SEEN 1 True True" in result.stdout, result.stdout + result.stderr[-2000:]


@pytest.mark.parametrize(
    "flags,expected",
    [
        (frozenset({"avx2", "avx512_bf16"}), "bfloat16"),
        (frozenset({"avx2", "amx_bf16"}), "bfloat16"),
        (frozenset({"avx2", "fma"}), "float32"),
        (frozenset(), "float32"),
    ],
)
def test_torso_dtype_auto_picks_what_the_cpu_computes_natively(flags, expected):
    dtype, why = cpu_features.choose_torso_dtype("auto", flags)
    assert dtype == expected and why.startswith(f"--torso_dtype=auto: {expected}")
    assert cpu_features.choose_torso_dtype("bfloat16", flags) == ("bfloat16", None)
    assert cpu_features.choose_torso_dtype("float32", flags) == ("float32", None)


def test_log_rhos_stay_zero_on_onednn_avx2_kernels():
    """The rest of the suite runs with oneDNN off (conftest), the project's
    default on x86-64 is on, and an AVX2-only CPU then runs oneDNN's AVX2
    kernels, whose float32 results round differently from Eigen's. A child
    pytest with TF_ENABLE_ONEDNN_OPTS=1 and oneDNN capped at AVX2
    (ONEDNN_MAX_CPU_ISA, so these are the kernels an AVX2-only CPU runs,
    whatever this CPU has) runs the pipeline's log-rho test: the actors'
    batches and the learner's T x B batch still compute the same policy.
    (bfloat16 is left out: TensorFlow sends it to oneDNN whenever the CPU
    has AVX512F, which a capped oneDNN cannot serve; an AVX2-only CPU sends
    it to Eigen.)"""
    if not cpu_features.is_x86_64(platform.machine()):
        pytest.skip("oneDNN's AVX2 kernels exist on x86-64 only")
    test = "tests/experiment_test.py::test_training_pipeline_pairs_each_action_with_its_policy"
    child = (
        "import sys, pytest, tensorflow;"
        "from tensorflow.python.util import _pywrap_util_port as port;"
        "assert port.IsMklEnabled(), 'oneDNN is off';"
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '{test}[4x2]',"
        f" '{test}[4x2-ff]']))"
    )
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", ONEDNN_MAX_CPU_ISA="AVX2")
    result = _run_python(child, env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "2 passed" in result.stdout, result.stdout[-2000:]


def _run_python(code: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`python -c code` in the repository root with `env`, output captured."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
