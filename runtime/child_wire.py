"""The wire between a parent and its child processes (runtime/child_process.py
and runtime/child_main.py), shared by both sides.

One socketpair per child, written with multiprocessing's Connection framing
(send_bytes: a 4-byte big-endian length, -1 then an 8-byte one for huge
messages, then the bytes); each message one pickled tuple:
  parent -> child: (type_, args, kwargs) first, then ("call", method, args,
    kwargs) or ("close",);
  child -> parent: ("ready", pid) once built, ("ok", result) for a call,
    ("error", type name, message, traceback) when the constructor or a
    method raised (the child then ends), ("closed", close()'s error or None).
The parent reads with deadlines (`read_message`), so that a hung or vanished
child is noticed even half-way through a message. No TensorFlow.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback

PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL

# How often a call waiting for its result checks that the child still lives. A dead
# child is normally noticed at once (its end of the pipe closes, so poll() returns
# and recv() raises EOFError); this bounds the delay when the pipe stays open, e.g.
# when the environment library forked a helper that inherited the descriptor.
POLL_INTERVAL_S = 0.5


class CutShort(Exception):
    """A message began but did not end by the deadline: the child stopped
    while it wrote (the pipe cannot be read in step after that)."""


def read_exactly(
    fd: int, size: int, deadline: float | None, alive=None
) -> bytes | None:
    """`size` bytes from `fd`; None when `deadline` passes before the first
    byte, CutShort when it passes after it, EOFError when the other end
    closes, or (without a deadline) when `alive()` says the writer is gone.

    The other end does not always close with the writer: a process the child
    forked (without exec: child_main keeps the pipe from exec'd programs)
    holds its end and may outlive a child killed mid-message, and the rest of
    that message never comes. So without a deadline the wait polls `alive`
    every POLL_INTERVAL_S."""
    import select

    chunks, left = [], size
    while left:
        if deadline is not None:
            wait = max(0.0, deadline - time.monotonic())
        else:
            wait = None if alive is None else POLL_INTERVAL_S
        readable, _, _ = select.select([fd], [], [], wait)
        if not readable:
            if deadline is None:  # polled: a slow writer is fine, a gone one is not
                if alive():
                    continue
                raise EOFError
            if left == size:
                return None
            raise CutShort
        chunk = os.read(fd, left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(conn, deadline: float | None, alive=None) -> bytes | None:
    """One message of a multiprocessing Connection (what send_bytes wrote: a
    4-byte big-endian length, -1 then an 8-byte one for huge messages, then
    the bytes), or None when `deadline` passes before it begins. Above 16 KiB
    (an observation's size) send_bytes writes the length and the bytes
    apart, and conn.recv_bytes would wait without end on a child stopped in
    between: a hung child must be noticed even then (CutShort)."""
    import struct

    fd = conn.fileno()
    header = read_exactly(fd, 4, deadline, alive)
    if header is None:
        return None
    (size,) = struct.unpack("!i", header)
    if size == -1:
        longer = read_exactly(fd, 8, deadline, alive)
        if longer is None:
            raise CutShort
        (size,) = struct.unpack("!Q", longer)
    payload = read_exactly(fd, size, deadline, alive) if size else b""
    if payload is None:
        raise CutShort
    return payload


def exception_fields(exception: BaseException) -> tuple[str, str, str]:
    return (
        type(exception).__qualname__,
        str(exception),
        "".join(traceback.format_exception(exception)),
    )
