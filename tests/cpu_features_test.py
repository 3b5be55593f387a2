"""cpu_features: the bfloat16 warning, on given CPU flags (so the tests mean
the same on every machine), and in experiment.py's flag path."""

from __future__ import annotations

import pytest
from run_helpers import run_command_line

import cpu_features
import experiment

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
