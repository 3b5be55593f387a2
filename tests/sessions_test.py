"""sessions.session_config: enough inter-op threads for every environment.

Each environment step is a py_func that holds an inter-op thread while it
waits for its process. The check: N py_funcs in one session.run that each
wait at a barrier for all N. They pass only if all N run at the same time;
with too few threads the barrier times out. TensorFlow sizes its inter-op
pool once per process (at the first session), so each case runs in a fresh
interpreter.
"""

import os
import subprocess
import sys

import pytest
from run_helpers import REPO_ROOT

from runtime import sessions

N = 6

SCRIPT = f"""
import threading
import tensorflow as tf
from runtime import sessions

tf.compat.v1.disable_eager_execution()
barrier = threading.Barrier({N}, timeout=float(__import__("sys").argv[2]))

def wait(x):
    barrier.wait()  # BrokenBarrierError unless all {N} arrive
    return x

outputs = [
    tf.compat.v1.py_func(wait, [tf.constant(float(i))], tf.float32)
    for i in range({N})
]
config = sessions.session_config(True, num_environments=int(__import__("sys").argv[1]))
with tf.compat.v1.Session(config=config) as session:
    print(sum(session.run(outputs)))
"""


def run_waiters(num_environments: int, timeout_s: float) -> subprocess.CompletedProcess:
    """The N waiters with the pool sized for `num_environments`; each gives
    up after `timeout_s` at the barrier."""
    env = {k: v for k, v in os.environ.items() if k != "TF_NUM_INTEROP_THREADS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(num_environments), str(timeout_s)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_environment_can_wait_at_once():
    # Generous: all N run at once, so they meet as soon as each has started.
    result = run_waiters(N, timeout_s=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(float(sum(range(N))))


@pytest.mark.skipif(
    (os.cpu_count() or 1) >= N, reason=f"needs fewer than {N} cores to starve"
)
def test_the_default_pool_cannot_wait_for_them_all():
    # The failure the setting prevents: one thread per core, N waiters. The
    # waiters that run hold every thread of the pool while they wait, so the
    # others never start: no timeout is long enough, and a short one ends it.
    result = run_waiters(0, timeout_s=2)
    assert result.returncode != 0
    assert "BrokenBarrierError" in result.stderr


def test_the_pool_size_counts_cores_and_environments():
    config = sessions.session_config(True, num_environments=16)
    assert config.inter_op_parallelism_threads == (os.cpu_count() or 1) + 16
    assert config.intra_op_parallelism_threads == 1
    assert sessions.session_config().inter_op_parallelism_threads == 0
