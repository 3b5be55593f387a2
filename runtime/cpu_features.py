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


# TensorFlow reads this variable once, at import: 1 turns its oneDNN
# optimisations on, 0 off; unset, TensorFlow turns them on by itself only on
# some x86 CPUs (those with AVX-512 features), not on AVX2-only ones.
ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
_X86_64 = frozenset({"x86_64", "amd64"})


def is_x86_64(machine: str) -> bool:
    """Whether platform.machine()'s `machine` is x86-64 (where oneDNN runs)."""
    return machine.lower() in _X86_64


def default_onednn(environ, machine: str) -> str | None:
    """Sets TF_ENABLE_ONEDNN_OPTS=1 in `environ` on an x86-64 `machine`
    (platform.machine()) when the user has not set it, before TensorFlow is
    imported; returns the line to log, or None when nothing was set.

    On a 2-core AVX2-only machine oneDNN on made the shallow agent's fastest
    command 1.57x faster (2,627 against 4,134 frames/s); on CPUs where
    TensorFlow turns it on by itself this changes nothing. A value the user
    set is never changed.
    """
    if ONEDNN_VARIABLE in environ or not is_x86_64(machine):
        return None
    environ[ONEDNN_VARIABLE] = "1"
    return (
        f"{ONEDNN_VARIABLE}=1: TensorFlow's oneDNN kernels on, the project's "
        f"default on x86-64 ({ONEDNN_VARIABLE}=0 turns them off)"
    )


TORSO_DTYPE_AUTO = "auto"


def choose_torso_dtype(requested: str, flags: frozenset[str]) -> tuple[str, str | None]:
    """(the torso dtype to use, why) for --torso_dtype: 'auto' is bfloat16
    where the CPU computes it natively, float32 elsewhere (and where the
    flags cannot be read); any other value is used as given (why = None)."""
    if requested != TORSO_DTYPE_AUTO:
        return requested, None
    if has_native_bfloat16(flags):
        return "bfloat16", "--torso_dtype=auto: bfloat16, this CPU computes it natively"
    return "float32", (
        "--torso_dtype=auto: float32, this CPU has no bfloat16 instructions "
        "(AVX512_BF16 or AMX-BF16) and would emulate them"
    )


def torso_dtype_for_this_cpu(requested: str) -> tuple[str, str | None, str | None]:
    """(the torso dtype, why it was chosen or None, a warning or None) for
    --torso_dtype on this machine's CPU: choose_torso_dtype and
    bfloat16_warning on its flags, read once."""
    flags = cpu_flags()
    torso_dtype, why = choose_torso_dtype(requested, flags)
    return torso_dtype, why, bfloat16_warning(torso_dtype, flags)
