"""Tests for py_process.py: objects in child processes called as TensorFlow ops.

The classes the children run are in tests/py_process_helpers.py (fake environments:
they raise, crash or hang on demand, which a real ALE game cannot); one test runs a
real ALE game. Every wait is bounded: `bounded()` runs a call in a thread and fails
the test if it does not return in time, so a hang fails instead of blocking CI.
"""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import py_process_helpers as helpers
import pytest
import tensorflow as tf

import py_process
from actor import supervisor as supervisor_lib
from py_process import PyProcess, PyProcessHook
from runtime import child_process, child_wire, errors

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)


def wait_for_a_call_in_flight(process, timeout=60.0):
    """Until another thread is inside a call on `process` (it holds the lock
    that serialises calls on the pipe): the event a test that kills or closes
    a child mid-call waits for, instead of a sleep."""
    deadline = time.monotonic() + timeout
    while not process._call_lock.locked():
        assert time.monotonic() < deadline, "no call started"
        time.sleep(0.01)


def bounded(fn, timeout=30.0):
    """Returns fn()'s result or re-raises its exception; fails after `timeout` s."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"call did not return within {timeout} s (hang)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def process_state(pid):
    """The /proc state letter of `pid` ('R', 'S', 'Z', ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture(autouse=True)
def close_leftovers():
    yield
    py_process.close_all(list(child_process._REGISTRY))


@pytest.fixture
def graph():
    with tf.Graph().as_default() as g:
        yield g


def test_small_computation_in_a_child_without_tensorflow(graph):
    process = PyProcess(helpers.Calculator, 10, scale=2)
    add = process.proxy.add(tf.constant(3))
    info = process.proxy.info()
    assert add.dtype == tf.int64 and add.shape == []
    bounded(
        process.start
    )  # how long it takes: benchmarks/components/py_process_bench.py
    with tf.compat.v1.Session() as session:
        assert bounded(lambda: session.run(add)) == 16
        assert bounded(lambda: session.run(add)) == 22
        pid, tf_imported = bounded(lambda: session.run(info))
    assert pid == process.pid != os.getpid()
    assert process.alive
    assert not tf_imported, "the child must not import TensorFlow"
    assert process in graph.get_collection(PyProcess.COLLECTION)
    process.close()


def test_positional_keyword_nested_and_none_outputs(graph):
    process = PyProcess(helpers.Calculator)
    combine_kw = process.proxy.combine(tf.constant(6, tf.int64), b=7, mode="product")
    combine_pos = process.proxy.combine(6, 7)
    nested = process.proxy.nested(tf.constant(5))
    noop = process.proxy.noop()
    assert isinstance(noop, tf.Operation)
    assert nested["pair"].frame.shape == [2, 3]
    assert nested["pair"].frame.dtype == tf.uint8
    bounded(process.start)
    with tf.compat.v1.Session() as session:
        assert bounded(lambda: session.run([combine_kw, combine_pos])) == [42, 13]
        value = bounded(lambda: session.run(nested))
        assert bounded(lambda: session.run(noop)) is None
    assert isinstance(value["pair"], helpers.Pair)
    assert value["pair"].frame.tolist() == [[5, 5, 5], [5, 5, 5]]
    assert value["name"] == b"calc"


def test_tensor_specs_receives_arguments_by_name(graph, monkeypatch):
    seen = []
    original = helpers.Calculator._tensor_specs

    def spy(method_name, kwargs, constructor_kwargs):
        seen.append((method_name, sorted(kwargs), constructor_kwargs))
        return original(method_name, kwargs, constructor_kwargs)

    monkeypatch.setattr(helpers.Calculator, "_tensor_specs", staticmethod(spy))
    process = PyProcess(helpers.Calculator, 1, scale=3)
    process.proxy.combine(1, b=2)
    assert seen == [("combine", ["a", "b"], {"scale": 3})]


def test_bad_graph_construction_gives_clear_errors(graph):
    process = PyProcess(helpers.Calculator)
    with pytest.raises(AttributeError, match="has no method 'nope'"):
        process.proxy.nope()
    with pytest.raises(TypeError, match=r"proxy.add\(\) arguments do not match"):
        process.proxy.add()
    with pytest.raises(TypeError, match="picklable"):
        PyProcess(helpers.Calculator, lambda: 0)
    with pytest.raises(TypeError, match="must be a class"):
        PyProcess(helpers.Calculator(), 1)


def test_many_threads_calling_concurrently(graph):
    shared = PyProcess(helpers.Calculator)
    others = [PyProcess(helpers.Calculator, 1000 * i) for i in range(1, 4)]
    shared_add = shared.proxy.add(1)
    # Four calls to the same process in one run: the ops run in parallel and the
    # process serialises them.
    four_adds = [shared.proxy.add(1) for _ in range(4)]
    other_adds = [p.proxy.add(1) for p in others]
    bounded(lambda: py_process.start_all([shared, *others]))
    num_threads, runs = 8, 25
    errors = []
    with tf.compat.v1.Session() as session:

        def worker(index):
            try:
                for _ in range(runs):
                    session.run(shared_add)
                    session.run(four_adds)
                    session.run(other_adds[index % len(others)])
            except Exception as e:  # noqa: BLE001 - checked below
                errors.append(e)

        threads = [
            threading.Thread(target=worker, args=(i,), daemon=True)
            for i in range(num_threads)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(t.is_alive() for t in threads), "worker threads hung"
        assert not errors, errors
        read_totals = [shared.proxy.add(0)] + [p.proxy.add(0) for p in others]
        total, *other_totals = bounded(lambda: session.run(read_totals))
    assert total == num_threads * runs * 5
    calls_per_other = [
        sum(1 for i in range(num_threads) if i % 3 == k) * runs for k in range(3)
    ]
    assert other_totals == [1000 * (k + 1) + calls_per_other[k] for k in range(3)]


def test_constructor_error_surfaces_from_start(graph):
    process = PyProcess(helpers.FailingConstructor, "nope")
    with pytest.raises(py_process.PyProcessRemoteError) as info:
        bounded(process.start)
    message = str(info.value)
    assert "ValueError: unknown level 'nope'" in message
    assert "PyProcess FailingConstructor (pid" in message
    assert info.value.exception_type == "ValueError"
    assert not process.alive
    assert wait_until(lambda: process_state(process.pid) is None)
    process.close()


def test_constructor_error_fails_session_creation_and_closes_the_rest(graph):
    good = [PyProcess(helpers.Calculator) for _ in range(2)]
    PyProcess(helpers.FailingConstructor, "nope")
    ops = [p.proxy.add(1) for p in good]

    def create_session():
        with graph.as_default():  # bounded() runs this in another thread
            return tf.compat.v1.train.MonitoredSession(hooks=[PyProcessHook()])

    with pytest.raises(py_process.PyProcessRemoteError, match="unknown level 'nope'"):
        bounded(create_session)
    del ops
    assert all(p.pid is not None and not p.alive for p in good)
    assert all(wait_until(lambda p=p: process_state(p.pid) is None) for p in good)


def test_method_error_surfaces_and_other_processes_keep_working(graph):
    failing = PyProcess(helpers.Calculator)
    healthy = PyProcess(helpers.Calculator)
    fail = failing.proxy.fail("boom: bad action 7")
    failing_add = failing.proxy.add(1)
    healthy_add = healthy.proxy.add(1)
    bounded(lambda: py_process.start_all([failing, healthy]))
    failed_pid = failing.pid
    with tf.compat.v1.Session() as session:
        with pytest.raises(tf.errors.OpError) as info:
            bounded(lambda: session.run(fail))
        assert "ValueError: boom: bad action 7" in info.value.message
        assert f"PyProcess Calculator (pid {failed_pid}): fail() raised" in (
            info.value.message
        )
        assert "helpers.py" in info.value.message  # the child's traceback
        # The failed child was shut down cleanly (exit code 0) and reaped.
        assert not failing.alive
        assert process_state(failed_pid) is None
        assert failing._child.popen.returncode == 0
        with pytest.raises(tf.errors.OpError, match="shut down after fail"):
            bounded(lambda: session.run(failing_add))
        assert bounded(lambda: session.run(healthy_add)) == 1
        bounded(failing.restart)
        assert bounded(lambda: session.run(failing_add)) == 1
        assert failing.pid != failed_pid


def test_close_runs_the_objects_close_and_ends_the_child(graph, tmp_path):
    marker = tmp_path / "closed"
    process = PyProcess(helpers.Calculator, close_marker=str(marker))
    add = process.proxy.add(1)
    process.close()  # Before start: a no-op.
    bounded(process.start)
    pid = process.pid
    with tf.compat.v1.Session() as session:
        assert bounded(lambda: session.run(add)) == 1
        bounded(process.close)
        assert marker.read_text() == str(pid)  # close() ran in the child
        assert process_state(pid) is None  # exited and reaped: no zombie
        assert not process.alive
        bounded(process.close)  # Closing twice is a no-op.
        with pytest.raises(tf.errors.OpError, match="PyProcess Calculator is closed"):
            bounded(lambda: session.run(add))


def test_close_after_errors(graph):
    after_method_error = PyProcess(helpers.Calculator)
    after_kill = PyProcess(helpers.Calculator)
    fail = after_method_error.proxy.fail("x")
    bounded(lambda: py_process.start_all([after_method_error, after_kill]))
    with tf.compat.v1.Session() as session:
        with pytest.raises(tf.errors.OpError):
            bounded(lambda: session.run(fail))
    os.kill(after_kill.pid, signal.SIGKILL)
    for process in (after_method_error, after_kill):
        bounded(process.close)
        assert process_state(process.pid) is None


def test_close_escalates_when_the_child_does_not_exit(graph, monkeypatch):
    monkeypatch.setattr(child_process, "_CLOSE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(child_process, "_TERMINATE_TIMEOUT_S", 0.5)
    process = PyProcess(helpers.StubbornClose)
    bounded(process.start)
    # Closed, not hung: bounded() fails the test if close() never returns.
    bounded(process.close)
    assert process_state(process.pid) is None


@pytest.mark.parametrize("how", ["busy", "stopped"])
def test_hung_child_is_killed_after_the_call_timeout(graph, how):
    """A child that does not answer within call_timeout_s is killed: the call
    fails (no hang), `alive` turns False and restart() brings a fresh one."""
    process = PyProcess(helpers.Calculator)
    process.call_timeout_s = 1.0
    add = process.proxy.add(1)
    sleep = process.proxy.sleep(60.0)
    bounded(process.start)
    with tf.compat.v1.Session() as session:
        assert bounded(lambda: session.run(add)) == 1
        pid = process.pid
        start = time.monotonic()
        if how == "busy":  # A method that never returns in time.
            call = sleep
        else:  # A process that cannot run at all (SIGSTOP), like a deadlock.
            os.kill(pid, signal.SIGSTOP)
            call = add
        with pytest.raises(tf.errors.OpError) as error:
            bounded(lambda: session.run(call), timeout=60)
        # Not killed before its timeout (a slower machine only adds to this).
        assert time.monotonic() - start >= 1.0
        assert (
            f"PyProcess Calculator (pid {pid}) was killed after no answer for 1 s "
            f"by the parent while running"
        ) in error.value.message
        assert not process.alive
        assert wait_until(lambda: process_state(pid) is None)
        bounded(process.restart)
        # A fresh child: the state starts over; quick calls are unaffected.
        assert bounded(lambda: session.run(add)) == 1


def test_sigkilled_child_gives_an_error_not_a_hang(graph):
    process = PyProcess(helpers.Calculator)
    add = process.proxy.add(1)
    sleep = process.proxy.sleep(60.0)
    bounded(process.start)
    with tf.compat.v1.Session() as session:
        assert bounded(lambda: session.run(add)) == 1
        # Killed while a call is pending: the pending call fails.
        pid = process.pid
        box = {}

        def pending():
            try:
                session.run(sleep)
            except tf.errors.OpError as e:
                box["error"] = e

        thread = threading.Thread(target=pending, daemon=True)
        thread.start()
        wait_for_a_call_in_flight(process)
        os.kill(pid, signal.SIGKILL)
        thread.join(60)  # a guard: a dead child ends the call at once
        assert not thread.is_alive(), "the pending call hung after SIGKILL"
        message = box["error"].message
        assert (
            f"PyProcess Calculator (pid {pid}) died: killed by signal SIGKILL "
            f"(while running sleep())"
        ) in message
        assert not process.alive
        # Later calls fail at once with the same cause.
        with pytest.raises(tf.errors.OpError, match="died: killed by signal SIGKILL"):
            bounded(lambda: session.run(add), timeout=10)


def test_last_error_keeps_the_typed_cause_that_session_run_turns_to_text(graph):
    """Inside session.run, py_func hands the caller only a tf.errors error with
    text; `last_error` keeps the PyProcessError itself, which
    failure_cause reads (the one decoding of that text's cause)."""
    from actor.supervisor import failure_cause

    process = PyProcess(helpers.Calculator)
    add, fail = process.proxy.add(1), process.proxy.fail("no such level")
    bounded(process.start)
    assert process.last_error is None
    with tf.compat.v1.Session() as session:
        with pytest.raises(tf.errors.OpError) as raised:
            bounded(lambda: session.run(fail), timeout=10)
        assert isinstance(process.last_error, py_process.PyProcessRemoteError)
        assert process.last_error.exception_message == "no such level"
        cause = failure_cause(raised.value, process)
        assert cause == str(process.last_error).splitlines()[0]
        assert "no such level" in cause
        bounded(process.restart)
        assert process.last_error is None  # A fresh child has no failure.
        pid = process.pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(tf.errors.OpError) as raised:
            bounded(lambda: session.run(add), timeout=10)
        assert isinstance(process.last_error, py_process.PyProcessDiedError)
        assert failure_cause(raised.value, process) == (
            f"PyProcess Calculator (pid {pid}) died: killed by signal SIGKILL "
            f"(while running add())"
        )


def test_idle_child_killed_and_other_deaths_are_named(graph):
    process = PyProcess(helpers.Calculator)
    add = process.proxy.add(1)
    crash = process.proxy.crash()
    exit_3 = process.proxy.exit_code(3)
    bounded(process.start)
    with tf.compat.v1.Session() as session:
        os.kill(process.pid, signal.SIGKILL)
        assert wait_until(lambda: not process.alive, timeout=5)
        with pytest.raises(tf.errors.OpError, match=r"died: killed by signal SIGKILL"):
            bounded(lambda: session.run(add), timeout=10)
        bounded(process.restart)
        # A segfault inside a C library (the child also prints a faulthandler
        # traceback on stderr).
        with pytest.raises(tf.errors.OpError, match=r"died: killed by signal SIGSEGV"):
            bounded(lambda: session.run(crash), timeout=10)
        bounded(process.restart)
        with pytest.raises(tf.errors.OpError, match=r"died: exited with code 3"):
            bounded(lambda: session.run(exit_3), timeout=10)


def test_restart_after_sigkill_gives_working_calls_again(graph):
    process = PyProcess(helpers.Calculator, 100)
    add = process.proxy.add(1)
    bounded(process.start)
    with tf.compat.v1.Session() as session:
        assert bounded(lambda: session.run(add)) == 101
        old_pid = process.pid
        os.kill(old_pid, signal.SIGKILL)
        with pytest.raises(tf.errors.OpError, match="SIGKILL"):
            bounded(lambda: session.run(add), timeout=10)
        bounded(process.restart)
        assert process.alive and process.pid != old_pid
        assert process_state(old_pid) is None  # the dead child was reaped
        # Same op, fresh object built from the same constructor arguments.
        assert bounded(lambda: session.run(add)) == 101
        # restart() of a healthy child kills it and starts another.
        healthy_pid = process.pid
        bounded(process.restart)
        assert process_state(healthy_pid) is None
        assert bounded(lambda: session.run(add)) == 101


def test_close_while_a_call_hangs_kills_the_child(graph, monkeypatch):
    monkeypatch.setattr(child_process, "_CLOSE_WAIT_FOR_CALL_S", 0.5)
    process = PyProcess(helpers.Calculator)
    sleep = process.proxy.sleep(60.0)
    bounded(process.start)
    pid = process.pid
    with tf.compat.v1.Session() as session:
        box = {}

        def pending():
            try:
                session.run(sleep)
            except tf.errors.OpError as e:
                box["error"] = e

        thread = threading.Thread(target=pending, daemon=True)
        thread.start()
        wait_for_a_call_in_flight(process)
        bounded(process.close, timeout=60)
        thread.join(60)
        assert not thread.is_alive()
        assert "was closed by the parent while running sleep()" in box["error"].message
    assert process_state(pid) is None


def test_children_started_from_short_lived_threads_survive_them(graph):
    # PR_SET_PDEATHSIG fires when the thread that forked the child exits; py_process
    # forks from one long-lived thread so that this does not kill the child.
    processes = [PyProcess(helpers.Calculator) for _ in range(2)]
    adds = [p.proxy.add(1) for p in processes]
    thread = threading.Thread(target=processes[0].start)
    thread.start()
    thread.join(30)
    bounded(processes[1].start)
    thread = threading.Thread(target=processes[1].restart)
    thread.start()
    thread.join(30)
    time.sleep(0.5)
    assert all(p.alive for p in processes)
    with tf.compat.v1.Session() as session:
        assert bounded(lambda: session.run(adds)) == [1, 1]


def test_repeated_restarts_leak_no_descriptors_or_processes(graph):
    process = PyProcess(helpers.Calculator)
    add = process.proxy.add(1)
    bounded(process.start)
    fds_before = len(os.listdir("/proc/self/fd"))
    pids = []
    for _ in range(5):
        pids.append(process.pid)
        bounded(process.restart)
    with tf.compat.v1.Session() as session:
        assert bounded(lambda: session.run(add)) == 1
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert all(process_state(pid) is None for pid in pids)


def test_output_checks_give_clear_errors_and_keep_the_process(graph):
    process = PyProcess(helpers.Calculator)
    wrong_shape = process.proxy.wrong_shape()
    wrong_dtype = process.proxy.wrong_dtype()
    add = process.proxy.add(1)
    bounded(process.start)
    with tf.compat.v1.Session() as session:
        with pytest.raises(
            tf.errors.OpError, match=r"returned shape \[3\] for output 0"
        ):
            bounded(lambda: session.run(wrong_shape))
        with pytest.raises(
            tf.errors.OpError,
            match="float64 for output 0 of 1, which cannot be cast to the int64",
        ):
            bounded(lambda: session.run(wrong_dtype))
        assert process.alive
        assert bounded(lambda: session.run(add)) == 1


def test_hook_starts_in_begin_and_closes_at_the_end(graph):
    processes = [PyProcess(helpers.Calculator, i) for i in range(3)]
    adds = [p.proxy.add(1) for p in processes]
    with tf.compat.v1.train.MonitoredSession(hooks=[PyProcessHook()]) as session:
        assert all(p.alive for p in processes)
        assert bounded(lambda: session.run(adds)) == [1, 2, 3]
        pids = [p.pid for p in processes]
    assert not any(p.alive for p in processes)
    assert all(process_state(pid) is None for pid in pids)


def test_hook_closes_children_when_the_session_exits_with_an_error(graph):
    # MonitoredSession skips end() here; the coordinator thread closes them.
    processes = [PyProcess(helpers.Calculator) for _ in range(2)]
    fail = processes[0].proxy.fail("boom")
    with pytest.raises(tf.errors.OpError, match="ValueError: boom"):
        with tf.compat.v1.train.MonitoredSession(hooks=[PyProcessHook()]) as session:
            pids = [p.pid for p in processes]
            bounded(lambda: session.run(fail))
    assert all(
        wait_until(lambda pid=pid: process_state(pid) is None, 5) for pid in pids
    )
    assert not any(p.alive for p in processes)


def test_real_atari_game_in_a_child(graph):
    from families import atari

    process = PyProcess(atari.PyProcessAtari, "pong", 1)
    initial = process.proxy.initial()
    step = process.proxy.step(tf.constant(0))
    bounded(process.start)
    with tf.compat.v1.Session() as session:
        frame, instruction = bounded(lambda: session.run(initial))
        assert frame.shape == (84, 84, 1) and frame.dtype == "uint8"
        assert instruction == b""
        reward, done, (frame, _) = bounded(lambda: session.run(step))
        assert frame.shape == (84, 84, 1)
        os.kill(process.pid, signal.SIGKILL)
        with pytest.raises(
            tf.errors.OpError, match=r"PyProcess PyProcessAtari \(pid \d+\) died"
        ):
            bounded(lambda: session.run(step), timeout=10)
        bounded(process.restart)
        assert bounded(lambda: session.run(initial))[0].shape == (84, 84, 1)


PARENT_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{repo!r}, {tests!r}]
    import tensorflow as tf
    import py_process, py_process_helpers
    with tf.Graph().as_default():
        process = py_process.PyProcess(py_process_helpers.Calculator,
                                       close_marker=sys.argv[1])
        process.start()
        print(process.pid, flush=True)
        time.sleep(120)
""")


def start_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT.format(repo=REPO_ROOT, tests=TESTS_DIR))
    marker = tmp_path / "closed"
    parent = subprocess.Popen(
        [sys.executable, str(script), str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        # SIGINT as a terminal's foreground job has it. A shell starts a
        # background job (`cmd &`) with SIGINT ignored, the child inherits
        # that, and Python then installs no KeyboardInterrupt handler: the
        # Ctrl-C test would fail for how the suite was launched.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = bounded(parent.stdout.readline, timeout=60)
        return parent, int(line), marker
    except BaseException:
        parent.kill()
        parent.wait()
        raise


def child_gone(pid):
    # The parent is dead, so the orphan's zombie (if any) belongs to init, which
    # in some containers does not reap: a zombie is gone as a process all the same.
    return process_state(pid) in (None, "Z")


@pytest.mark.slow
def test_ctrl_c_on_the_parent_leaves_no_orphans(tmp_path):
    parent, child_pid, marker = start_parent(tmp_path)
    try:
        # Ctrl-C in a terminal signals the whole foreground process group.
        os.killpg(parent.pid, signal.SIGINT)
        assert parent.wait(30) != 0
        assert wait_until(lambda: child_gone(child_pid), 10)
        assert marker.read_text() == str(child_pid)  # closed cleanly by atexit
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.slow
def test_parent_killed_leaves_no_orphans(tmp_path):
    parent, child_pid, marker = start_parent(tmp_path)
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert wait_until(lambda: child_gone(child_pid), 10), (
            f"child {child_pid} outlived its SIGKILLed parent"
        )
    finally:
        parent.kill()
        parent.wait()


# -- a child killed while it constructs ---------------------------------------------


def _no_wait(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def _kill_while_constructing(tmp_path, kills: int, monkeypatch):
    """An environment supervisor's start of a SlowToStart child, SIGKILLed
    `kills` times while its constructor waits; then the constructor may
    finish. Returns (the error the start raised or None, the process, the
    pids that were started, the supervisor)."""
    monkeypatch.setattr(supervisor_lib, "ENV_RESTART_DELAY_SECS", 0.01)
    go, started = str(tmp_path / "go"), str(tmp_path / "started")
    process = PyProcess(helpers.SlowToStart, go=go, started=started)
    supervisor = supervisor_lib.EnvironmentSupervisor(0, "slow", [process])
    done = threading.Event()

    def started_pids() -> list[int]:
        if not os.path.exists(started):
            return []
        with open(started) as f:
            return [int(line) for line in f if line.strip()]

    def wait_for_pids(n: int) -> None:
        deadline = time.monotonic() + 60
        while len(started_pids()) < n and time.monotonic() < deadline:
            if done.wait(0.01):
                return

    def killer() -> None:
        for n in range(1, kills + 1):
            wait_for_pids(n)
            if done.is_set():
                return
            os.kill(started_pids()[n - 1], signal.SIGKILL)
        wait_for_pids(kills + 1)
        open(go, "w").close()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    error = None
    try:
        supervisor.start(_no_wait)
    except (py_process.PyProcessError, errors.EnvironmentFailedError) as e:
        error = e
    done.set()
    thread.join(timeout=60)
    return error, process, started_pids(), supervisor


def test_a_child_killed_while_constructing_is_started_again(tmp_path, monkeypatch):
    """A signal during construction (the OOM killer, say) is a crash like one
    in the middle of a run: the supervisor starts the environment again in a
    fresh process, after its back-off, and counts the failure and the
    restart as it counts any other."""
    error, process, pids, supervisor = _kill_while_constructing(
        tmp_path, 2, monkeypatch
    )
    try:
        assert error is None
        assert len(pids) == 3 and process.proxy is not None
        assert process.alive and process.pid == pids[-1]
        assert process._call("ping", (), {}) == pids[-1]
        assert supervisor.failures_in_a_row == 2
        assert supervisor.environment_restarts == 1  # the restart that held
    finally:
        process.close()


def test_a_child_killed_at_every_start_is_given_up_on(tmp_path, monkeypatch):
    kills = supervisor_lib.ENV_FAILURES_BEFORE_GIVING_UP
    error, process, pids, _ = _kill_while_constructing(tmp_path, kills, monkeypatch)
    process.close()
    assert isinstance(error, errors.EnvironmentFailedError)
    assert "killed by signal SIGKILL" in str(error)
    assert f"failed {kills} times in a row" in str(error)
    assert len(pids) == kills
    assert not process.alive


def test_a_constructor_that_raises_is_not_started_again(monkeypatch):
    """A bad level (the constructor raises) fails the start at once: no
    retry, nothing counted."""
    monkeypatch.setattr(supervisor_lib, "ENV_RESTART_DELAY_SECS", 0.01)
    launches = []
    original = PyProcess._launch_locked

    def counting(self):
        launches.append(1)
        return original(self)

    monkeypatch.setattr(PyProcess, "_launch_locked", counting)
    process = PyProcess(helpers.FailingConstructor, level="no_such_level")
    supervisor = supervisor_lib.EnvironmentSupervisor(0, "bad", [process])
    with pytest.raises(py_process.PyProcessRemoteError):
        supervisor.start(_no_wait)
    assert len(launches) == 1
    assert supervisor.failures_in_a_row == supervisor.environment_restarts == 0
    with pytest.raises(py_process.PyProcessRemoteError):
        py_process.start_all([PyProcess(helpers.FailingConstructor, level="x")])


def test_a_program_the_child_starts_does_not_hold_its_pipe():
    """An engine the environment starts (ViZDoom's, here a `sleep` started
    without close_fds) gets none of the child's sockets: otherwise, when the
    child dies and the engine lives on, the parent never sees the pipe end."""
    process = PyProcess(helpers.StartsAProgram)
    try:
        process.start()
        program = process._call("program", (), {})
        links = []
        for fd in os.listdir(f"/proc/{program}/fd"):
            # A file the program opens and closes as it starts (its dynamic
            # loader's, its locale's) may be gone by the time it is read; an
            # inherited socket stays.
            with contextlib.suppress(FileNotFoundError):
                links.append(os.readlink(f"/proc/{program}/fd/{fd}"))
        assert links and not [link for link in links if link.startswith("socket:")]
    finally:
        process.close()


def test_a_message_cut_short_by_a_killed_child_whose_pipe_lives_on_ends():
    """Without a call timeout: a child killed mid-message while something it
    started (a ViZDoom engine) still holds its end of the pipe, so no EOF
    comes. The read waits while the child lives (a slow writer) and raises
    EOFError once it is gone, instead of waiting for ever (found as a hung
    ViZDoom run at its end, after an environment process was SIGKILLed)."""
    import struct
    import threading
    from multiprocessing import connection

    parent, child = connection.Pipe(duplex=True)  # `child` stays open
    polls = []

    def alive() -> bool:
        polls.append(1)
        return len(polls) < 3  # alive for two polls, then gone

    outcome = []

    def read():
        try:
            outcome.append(child_wire.read_message(parent, None, alive))
        except EOFError as e:
            outcome.append(e)

    try:
        os.write(child.fileno(), struct.pack("!i", 100_000) + b"x" * 10)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(120)  # a guard against a hang, not a timing check
        assert outcome and isinstance(outcome[0], EOFError), outcome
        assert len(polls) == 3  # it kept waiting while the writer lived
    finally:
        parent.close()
        child.close()


def test_a_message_cut_short_by_a_stopped_child_ends_at_the_deadline():
    """A child stopped after the length of a big message and before its
    bytes (send_bytes writes them apart above 16 KiB): the parent's read
    ends at the call's deadline instead of waiting for ever; a whole message
    reads back, and nothing at all is a plain timeout (None)."""
    import struct
    import time
    from multiprocessing import connection

    parent, child = connection.Pipe(duplex=True)
    try:
        payload = b"x" * 100_000
        child.send_bytes(payload)
        assert child_wire.read_message(parent, time.monotonic() + 5) == payload
        assert child_wire.read_message(parent, time.monotonic() + 0.1) is None
        # The length alone, as a child stopped mid-message leaves it.
        os.write(child.fileno(), struct.pack("!i", len(payload)))
        # CutShort at the deadline: without one the read would wait for ever.
        with pytest.raises(child_wire.CutShort):
            child_wire.read_message(parent, time.monotonic() + 0.3)
    finally:
        parent.close()
        child.close()
