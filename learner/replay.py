"""Experience replay on the learner (the paper's section 5.2.2).

With --replay_proportion p > 0 each learner (tower) keeps a buffer of the
last --replay_capacity unrolls it took from its queue. Each update's batch of
B unrolls is B - R fresh ones from the queue followed by R = round(p x B)
sampled uniformly, with replacement, from the buffer after the fresh ones
entered it (so early on a batch may replay one of its own fresh unrolls).
The buffer is first in, first out: once full, each new unroll replaces the
oldest. A replayed unroll is the one its actor sent, with the behaviour
policy's logits, the agent state and the `policy_frames` it was acted with,
so its policy lag grows while it waits: what the paper's study measures.

The buffer is a ring of local variables on its tower's CPU (host memory),
[capacity, ...] for each tensor of an unroll, allocated whole when the
training session starts: `unroll_bytes(specs) x capacity` bytes, stated on
the run's first line and checked against the memory available before
training (`memory_problem`). Local variables are never checkpointed: the
buffer starts empty with every training session (a resume, a restarted
learner task), and fills again from fresh unrolls.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from config import Config
from runtime.errors import FlagError

# What a string element of an unroll (the level name, DeepMind Lab's
# instruction) is counted as: TensorFlow's string object plus a short text.
STRING_BYTES = 64
# The share of the memory available that the buffers may take: the rest of
# the run (environments, the agent, TensorFlow) needs some too.
MEMORY_SHARE = 0.8


def unroll_bytes(specs) -> int:
    """Bytes one unroll takes in a buffer: `specs` is an ActorOutput of
    tf.TensorSpec (one unroll, no batch dimension); strings count
    STRING_BYTES an element."""
    total = 0
    for spec in tf.nest.flatten(specs):
        elements = spec.shape.num_elements()
        size = STRING_BYTES if spec.dtype == tf.string else spec.dtype.size
        total += elements * size
    return total


def available_memory_bytes() -> int | None:
    """The memory this process may still take: the kernel's MemAvailable,
    or the cgroup's limit less its usage where that is lower; None where
    neither can be read."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            room = int(limit) - used
            available = room if available is None else min(available, room)
    except (OSError, ValueError):
        pass
    return available


def memory_problem(
    per_unroll: int, capacity: int, num_buffers: int, available: int | None
) -> str | None:
    """A one-line refusal when `num_buffers` buffers of `capacity` unrolls of
    `per_unroll` bytes take more than MEMORY_SHARE of `available` bytes;
    None when they fit (or the memory available is unknown)."""
    needed = per_unroll * capacity * num_buffers
    if available is None or needed <= MEMORY_SHARE * available:
        return None
    fits = int(MEMORY_SHARE * available) // (per_unroll * num_buffers)
    buffers = f"{num_buffers} buffers" if num_buffers > 1 else "the buffer"
    return (
        f"--replay_capacity={capacity}: {buffers} of {capacity} unrolls x "
        f"{per_unroll:,} bytes = {needed:,} bytes, more than "
        f"{MEMORY_SHARE:.0%} of the {available:,} bytes of memory available "
        f"here; use --replay_capacity={fits} or less (or a machine with more "
        f"memory, or --replay_proportion=0)."
    )


def describe_bytes(count: int) -> str:
    """1234567 -> '1.2 MB' (decimal units)."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def _local_variable(initial_value: tf.Tensor, name: str) -> tf.Variable:
    return tf.compat.v1.Variable(
        initial_value,
        trainable=False,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
        use_resource=True,
        name=name,
    )


class ReplayBuffer:
    """A first-in-first-out ring of `capacity` unrolls, sampled uniformly.

    `specs`: an ActorOutput (any nest) of tf.TensorSpec, one unroll without
    a batch dimension. Build it under the device (and variable placement)
    where it should live. `insert` and `sample` take and give batch-major
    nests ([n, ...] each).
    """

    def __init__(self, specs, capacity: int, seed: int | None = None):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, not {capacity}")
        self.capacity = capacity
        self._specs = specs
        self._seed = seed
        with tf.name_scope("replay"):
            self._slots = [
                _local_variable(
                    # Not tf.zeros: TensorFlow folds zeros of a constant shape
                    # into a constant, and each executor of the graph keeps
                    # it beside the variable (three times the buffer's memory
                    # at the start of training, measured; with oneDNN's
                    # allocator a 9.2 GB buffer crashed the run there). The
                    # Empty op is marked not to be optimised: its zeros are
                    # made when the variable is initialised, and taken over.
                    tf.raw_ops.Empty(
                        shape=[capacity, *spec.shape.as_list()],
                        dtype=spec.dtype,
                        init=True,
                    ),
                    name="unrolls",
                )
                for spec in tf.nest.flatten(specs)
            ]
            # Unrolls inserted since the session started (not capped).
            self._inserted = _local_variable(tf.constant(0, tf.int64), "inserted")

    def size(self) -> tf.Tensor:
        """int64 []: unrolls held, min(inserted, capacity)."""
        return tf.minimum(self._inserted.read_value(), self.capacity)

    def insert(self, unrolls) -> tf.Operation:
        """Writes the [n, ...] unrolls at the ring's next n positions (over
        the oldest once full), in order."""
        flat = tf.nest.flatten(unrolls)
        count = tf.shape(flat[0], out_type=tf.int64)[0]
        start = self._inserted.read_value()
        positions = (start + tf.range(count, dtype=tf.int64)) % self.capacity
        with tf.control_dependencies(
            [
                slot.scatter_update(tf.IndexedSlices(t, positions))
                for slot, t in zip(self._slots, flat, strict=True)
            ]
        ):
            return self._inserted.assign_add(count).op

    def sample(self, count: int):
        """`count` unrolls drawn uniformly with replacement from those held
        (the nest of specs, [count, ...] each). Run after an insert: an
        empty buffer gives its zeros."""
        held = tf.maximum(self.size(), 1)
        positions = tf.random.uniform([count], 0, held, dtype=tf.int64, seed=self._seed)
        return tf.nest.pack_sequence_as(
            self._specs,
            # sparse_read gathers from the variable itself: a read_value()
            # would hold the whole buffer's tensor, and the next insert
            # would copy it all rather than write in place.
            [slot.sparse_read(positions) for slot in self._slots],
        )

    def contents(self):
        """The unrolls held, oldest first ([size, ...] each)."""
        size = self.size()
        positions = (
            self._inserted.read_value() - size + tf.range(size, dtype=tf.int64)
        ) % self.capacity
        return tf.nest.pack_sequence_as(
            self._specs, [slot.sparse_read(positions) for slot in self._slots]
        )

    def insert_then_sample(self, unrolls, count: int):
        """Inserts the fresh [n, ...] `unrolls`, then samples `count` from the
        buffer they are in: the replayed part of a batch."""
        with tf.control_dependencies([self.insert(unrolls)]):
            return self.sample(count)


def checked_config(config: Config, specs, num_buffers: int) -> Config:
    """With replay: `config` with one buffer's bytes (for the first line),
    once the `num_buffers` buffers this process holds (one a learner on one
    machine, one a learner task, none on an actor) are checked to fit in
    its memory; `specs`: an unroll's (actor_output_specs).

    Raises:
      FlagError: they do not fit (memory_problem).
    """
    learner = config.learner
    per_unroll = unroll_bytes(specs)
    if num_buffers and (
        problem := memory_problem(
            per_unroll, learner.replay_capacity, num_buffers, available_memory_bytes()
        )
    ):
        raise FlagError(problem)
    return dataclasses.replace(
        config,
        learner=dataclasses.replace(
            learner, replay_buffer_bytes=per_unroll * learner.replay_capacity
        ),
    )
