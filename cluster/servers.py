"""The TensorFlow side of a cluster: the ClusterSpec, the servers, session
configs with device filters and keepalive, and fast start-up of actor
sessions. The cluster's description (spec.py), its addresses (flags and
TF_CONFIG: addresses.py; parsing: hosts.py) and the ports (ports.py) never
import TensorFlow.

Security: a TensorFlow server runs any graph sent to it and listens on all
interfaces (*:PORT, IPv4 and IPv6; there is no option to bind loopback only).
Run clusters on a private network with the ports firewalled.
"""

from __future__ import annotations

import os
import time

from absl import logging

from cluster.hosts import describe_setting, parse_host_port
from cluster.ports import PortInUseError, port_in_use, wait_for_port
from cluster.spec import (
    ACTOR_JOB,
    LEARNER_JOB,
    ClusterConfig,
    device_filters,
    from_tf_config,
)


def cluster_spec(config: ClusterConfig):
    """tf.train.ClusterSpec with jobs 'learner' (1 task) and 'actor' (N tasks)."""
    import tensorflow as tf

    return tf.train.ClusterSpec(
        {LEARNER_JOB: list(config.learner_hosts), ACTOR_JOB: list(config.actor_hosts)}
    )


def server_config(config: ClusterConfig, base=None):
    """tf.compat.v1.ConfigProto with this task's device filters.

    Pass it both to `start_server` and to the session (MonitoredSession /
    FastWorkerSessionCreator). `base` (a ConfigProto) is copied, not modified,
    so callers can add GPU or threading options.
    """
    import tensorflow as tf

    proto = tf.compat.v1.ConfigProto()
    if base is not None:
        proto.CopyFrom(base)
    del proto.device_filters[:]
    proto.device_filters.extend(device_filters(config))
    return with_serving_threads(proto)


# Inter-op threads a task keeps beyond one per core.
SERVING_THREADS = 1


def with_serving_threads(proto):
    """`proto` with an inter-op pool of one thread per core this process may
    run on plus SERVING_THREADS (unless TF_NUM_INTEROP_THREADS or `proto`
    sets one).

    A task's server answers the other tasks' tensor requests (a remote
    tower's parameters, an actor's weight copy) on its inter-op pool. With
    the default pool, one thread per core, the task's own kernels hold every
    thread while it computes, and a request waits until they are done: two
    learner tasks on a core each ran their towers one after the other, tower
    1 receiving its parameters only once tower 0 had finished (traced; 388
    ms per update of the shallow agent instead of ~200; BENCHMARKS.md,
    "Several learners"). A spare thread answers at once; waiting costs no
    CPU.
    """
    if proto.inter_op_parallelism_threads == 0 and (
        "TF_NUM_INTEROP_THREADS" not in os.environ
    ):
        cores = (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        )
        proto.inter_op_parallelism_threads = (
            cores or os.cpu_count() or 1
        ) + SERVING_THREADS
    return proto


# gRPC keepalive on the connections between tasks. A peer whose host drops
# off the network (a pulled cable, a dead switch port) neither closes nor
# resets its connections; without pings, a call to it waits until the network
# comes back, whatever its RunOptions timeout. With them the call fails about
# keepalive_time + keepalive_timeout after the peer went silent. Pings go only
# while a call is in flight (gRPC's default), and no more often than every
# 5 s, so a busy learner's server never sees them as abuse. TensorFlow reads
# these options from TF_GRPC_DEFAULT_OPTIONS when it makes its first channel.
GRPC_KEEPALIVE_OPTIONS = "grpc.keepalive_time_ms=5000,grpc.keepalive_timeout_ms=5000"


def start_server(config: ClusterConfig, session_config=None):
    """Starts this task's tf.distribute.Server (listening on all interfaces).

    Also turns on gRPC keepalive (GRPC_KEEPALIVE_OPTIONS) unless
    TF_GRPC_DEFAULT_OPTIONS is set already. Raises PortInUseError, naming the
    port and the setting it came from, when another process holds the port.
    """
    import tensorflow as tf

    os.environ.setdefault("TF_GRPC_DEFAULT_OPTIONS", GRPC_KEEPALIVE_OPTIONS)
    _, port = parse_host_port(config.address)
    setting = describe_setting(
        config.source,
        config.job_name,
        config.task if from_tf_config(config.source) else None,
    )
    if from_tf_config(config.source):
        what = f"port {port} for {setting}"  # Names the task: cluster.actor[3].
    else:
        what = f"port {port} for {setting} task {config.task}"
    if (err := port_in_use(port)) is not None:
        raise PortInUseError(
            f"{what} is in use: {err.strerror}; stop the process that holds it "
            f'(`ss -ltnp "sport = :{port}"` shows it, maybe a task of an earlier '
            f"run) or choose another port in {setting}"
        )
    if session_config is None:
        session_config = server_config(config)
    try:
        server = tf.distribute.Server(
            cluster_spec(config),
            job_name=config.job_name,
            task_index=config.task,
            config=session_config,
            start=True,
        )
    except tf.errors.UnknownError as e:
        # The port may have been taken between the check and the bind.
        raise PortInUseError(
            f"{what}: the TensorFlow server could not start ({e.message}); the "
            f"port is probably in use, choose another port in {setting}"
        ) from e
    logging.info(
        "Started TensorFlow server for %s at %s (listening on all interfaces, port %d)",
        config.device,
        server.target,
        port,
    )
    _servers.append(server)
    return server


# The servers this process started. A tf.distribute.Server cannot be shut
# down: it lives until the process exits (see server_started).
_servers: list = []


def server_started() -> bool:
    """Whether this process runs a TensorFlow server (a cluster task)."""
    return bool(_servers)


# ---------------------------------------------------------------------------
# Fast start-up of non-chief (actor) sessions.


def _uninitialized(sess, op) -> list[str]:
    """The names a report_uninitialized_variables-style op returns."""
    if op is None:
        return []
    names = sess.run(op)
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names.flat]


def _describe(names: list[str]) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return "uninitialised: " + ", ".join(names[:3]) + more


class FastWorkerSessionCreator:
    """SessionCreator for actor tasks that connects within about a second.

    The default WorkerSessionCreator polls the chief every 30 s
    (SessionManager's fixed recovery_wait_secs), so an actor started before
    the learner idles up to 30 s. This one first waits for the learner's port
    to accept TCP connections (a session run cannot be bounded by a timeout
    while TensorFlow looks for a missing task, so it must not start before the
    learner is up), then polls the scaffold's readiness ops every `poll_secs`
    until the learner has initialised the global variables, and runs the
    local init op. It logs 'waiting for learner at HOST:PORT' every
    `log_every_secs` and raises TimeoutError after `max_wait_secs` (None =
    wait forever, what actors that outlive a learner restart want).

    Use it with tf.compat.v1.train.MonitoredSession(session_creator=...);
    call create_session inside the graph it serves (MonitoredSession does).
    It is registered as a virtual subclass of tf.compat.v1.train.SessionCreator
    (an ABC) when first constructed, so this module imports without
    TensorFlow (launch.py uses it too).

    It is the one place that asks "is the learner up and ready?": after a
    failed attempt, `learner_reachable` says whether the learner's port
    answered and `uninitialized` lists the variables the learner had not
    initialised yet (None until a session was made), for callers that explain
    the wait (actor_task.py names the flags of another model).
    """

    def __init__(
        self,
        master: str,
        learner_host: str,
        scaffold=None,
        config=None,
        poll_secs: float = 0.5,
        log_every_secs: float = 5.0,
        max_wait_secs: float | None = None,
        check=None,
    ):
        import tensorflow as tf

        tf.compat.v1.train.SessionCreator.register(FastWorkerSessionCreator)
        # check(session): called while the learner has not initialised what
        # this task declares (it may run another model); it may raise.
        self._check = check
        parse_host_port(learner_host)  # Fail fast on a bad address.
        self._master = master
        self._learner_host = learner_host
        self._scaffold = scaffold or tf.compat.v1.train.Scaffold()
        self._config = config
        self._poll_secs = poll_secs
        self._log_every_secs = log_every_secs
        self._max_wait_secs = max_wait_secs
        self.learner_reachable = False
        self.uninitialized: list[str] | None = None

    def create_session(self):
        import tensorflow as tf

        self._scaffold.finalize()
        graph = tf.compat.v1.get_default_graph()
        start = time.monotonic()
        next_log = start + self._log_every_secs

        def remaining() -> float | None:
            if self._max_wait_secs is None:
                return None
            return self._max_wait_secs - (time.monotonic() - start)

        while True:
            left = remaining()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"no session with the learner at {self._learner_host} after "
                    f"{self._max_wait_secs:.0f} s; check that the learner runs"
                )
            self.learner_reachable = False
            self.uninitialized = None
            wait_for_port(
                self._learner_host,
                timeout_secs=left,
                log_every_secs=self._log_every_secs,
            )
            self.learner_reachable = True
            sess = tf.compat.v1.Session(self._master, graph=graph, config=self._config)
            try:
                missing = _uninitialized(sess, self._scaffold.ready_for_local_init_op)
                if not missing:
                    if self._scaffold.local_init_op is not None:
                        sess.run(
                            self._scaffold.local_init_op,
                            feed_dict=self._scaffold.local_init_feed_dict,
                        )
                    missing = _uninitialized(sess, self._scaffold.ready_op)
                self.uninitialized = missing
                if missing and self._check is not None:
                    self._check(sess)
                reason = _describe(missing) if missing else None
                if reason is None:
                    logging.info(
                        "Connected to learner at %s after %.1f s",
                        self._learner_host,
                        time.monotonic() - start,
                    )
                    return sess
            except (
                tf.errors.UnavailableError,
                tf.errors.AbortedError,
                tf.errors.CancelledError,
                tf.errors.DeadlineExceededError,
            ) as e:
                # The learner went away or restarted while we connected.
                reason = f"{type(e).__name__}: {e.message.splitlines()[0]}"
            except BaseException:
                sess.close()
                raise
            sess.close()
            now = time.monotonic()
            if now >= next_log:
                logging.info(
                    "waiting for learner at %s to initialise the model "
                    "(%.0f s so far; %s)",
                    self._learner_host,
                    now - start,
                    reason,
                )
                next_log = now + self._log_every_secs
            time.sleep(self._poll_secs)


def worker_session_creator(
    config: ClusterConfig,
    server,
    scaffold=None,
    session_config=None,
    **kwargs,
) -> FastWorkerSessionCreator:
    """A FastWorkerSessionCreator for this actor task's server and learner.

    `session_config` defaults to server_config(config); `kwargs` go to
    FastWorkerSessionCreator (poll_secs, log_every_secs, max_wait_secs,
    check).
    """
    return FastWorkerSessionCreator(
        server.target,
        config.learner_host,
        scaffold=scaffold,
        config=session_config if session_config is not None else server_config(config),
        **kwargs,
    )
