"""What the CPU can do that changes which settings are fast (TensorFlow-free).

bfloat16 convolutions (`--torso_dtype=bfloat16`) run natively only where the
CPU has AVX512_BF16 or AMX-BF16; elsewhere oneDNN emulates them, and the
deep agent's training is then several times slower than in float32 (on a
2-core AVX2 machine: a first learner step of over 80 s and 66 frames/s
against ~330 in float32).
"""

from __future__ import annotations

# /proc/cpuinfo's names of the instruction sets that compute bfloat16.
BFLOAT16_INSTRUCTIONS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's flags in `cpuinfo`; empty when it cannot be
    read (not Linux, a sandbox)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def has_native_bfloat16(flags: frozenset[str]) -> bool:
    return bool(flags & BFLOAT16_INSTRUCTIONS)


def bfloat16_warning(torso_dtype: str, flags: frozenset[str]) -> str | None:
    """The warning for --torso_dtype=bfloat16 on a CPU that emulates it, or
    None (float32, a CPU with bfloat16 instructions, or flags unknown)."""
    if torso_dtype != "bfloat16" or not flags or has_native_bfloat16(flags):
        return None
    return (
        "--torso_dtype=bfloat16: this CPU has no bfloat16 instructions "
        "(AVX512_BF16 or AMX-BF16), so TensorFlow emulates them and training "
        "is several times slower than in float32 (on an AVX2 machine the deep "
        "agent trained at 66 frames/s against ~330 in float32). Use "
        "--torso_dtype=float32 here."
    )
