"""Python objects living in child processes, called from TensorFlow graphs as ops.

Environments (ALE, DeepMind Lab) are stateful C libraries that hold the GIL while
they step and may crash. Each `PyProcess` runs one object of a user class in its own
child process; `process.proxy.method(*tensors)` builds a `py_func` op that sends the
call to the child over a pipe and returns its result as tensors:

    env = PyProcess(PyProcessAtari, 'pong', seed=1) # registers in a graph collection
    observation = env.proxy.initial()                # nest of tf.Tensor
    reward, done, observation = env.proxy.step(action)
    with tf.compat.v1.train.MonitoredSession(hooks=[PyProcessHook()]) as session:
        ...                                          # children started in begin()

The op's dtypes and static shapes come from the class's static method
`_tensor_specs(method_name, kwargs, constructor_kwargs)`, which returns a nest of
`tf.TensorSpec` (or None: the proxy then returns a `tf.Operation`). `kwargs` maps the
method's parameter names to the tensors (or Python values) passed to the proxy.

The process itself (its child, pipe, failures, restarts and shutdown) is
child_process.ChildProcess, which PyProcess extends; its errors,
`start_each`, `start_all`, `close_all` and `killed_by_signal` are
re-exported here. Failure behaviour: see
child_process.py; inside `session.run` an error of the child surfaces as a
`tf.errors` error whose message contains its text, and the process's
`last_error` keeps the PyProcessError itself.

Child processes import child_process.py, never this module: TensorFlow stays
out of them.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

import numpy as np
import tensorflow as tf

from runtime.child_process import (
    ChildProcess,
    PyProcessDiedError,
    PyProcessError,
    PyProcessRemoteError,
    close_all,
    killed_by_signal,
    start_all,
    start_each,
)

__all__ = [
    "PyProcess",
    "PyProcessDiedError",
    "PyProcessError",
    "PyProcessHook",
    "PyProcessRemoteError",
    "close_all",
    "killed_by_signal",
    "start_all",
    "start_each",
]


class PyProcess(ChildProcess):
    """An object of `type_` living in a child process, with TensorFlow ops to
    call it (`proxy.method(...)`).

    Args:
      type_: a class importable by module name in a fresh interpreter (defined at
        module level, not in __main__). It must have a static method
        `_tensor_specs(method_name, kwargs, constructor_kwargs)` returning a nest of
        `tf.TensorSpec` or None for each method called through the proxy; it may
        have a `close()` method, called in the child at shutdown.
      *constructor_args, **constructor_kwargs: picklable; the child constructs
        `type_(*constructor_args, **constructor_kwargs)`.

    The process is added to the default graph's collection `PyProcess.COLLECTION`
    (for `PyProcessHook`). It is not started by the constructor.
    """

    COLLECTION = "py_process_processes"

    def __init__(self, type_: type, *constructor_args: Any, **constructor_kwargs: Any):
        super().__init__(type_, *constructor_args, **constructor_kwargs)
        self._proxy = _Proxy(self)
        tf.compat.v1.add_to_collection(self.COLLECTION, self)

    @property
    def proxy(self) -> _Proxy:
        """`proxy.method(*args, **kwargs)` builds an op calling `method` in the child."""
        return self._proxy

    def _method_arguments(self, method: str, args: tuple, kwargs: dict) -> dict:
        """Binds the proxy call's arguments to the method's parameter names."""
        function = getattr(self._type, method)
        signature = inspect.signature(function)
        if not isinstance(
            inspect.getattr_static(self._type, method), (staticmethod, classmethod)
        ):
            parameters = list(signature.parameters.values())[1:]  # drop self
            signature = signature.replace(parameters=parameters)
        try:
            return dict(signature.bind(*args, **kwargs).arguments)
        except TypeError as e:
            raise TypeError(
                f"PyProcess {self._label}: proxy.{method}() arguments do "
                f"not match {self._label}.{method}{signature}: {e}"
            ) from e

    def _build_op(self, method: str, args: tuple, kwargs: dict) -> Any:
        arguments = self._method_arguments(method, args, kwargs)
        tensor_specs = getattr(self._type, "_tensor_specs", None)
        if tensor_specs is None:
            raise AttributeError(
                f"PyProcess {self._label}: {self._label} has no static method "
                f"_tensor_specs(method_name, kwargs, constructor_kwargs), which gives "
                f"the dtypes and shapes of {method}()'s outputs."
            )
        specs = tensor_specs(method, arguments, self._constructor_kwargs)
        outputs_plan = _Outputs(specs, f"{self._label}._tensor_specs({method!r}, ...)")
        pack_inputs, flat_inputs = _input_packer(tuple(args), dict(kwargs))

        def py_call(*values: Any) -> list:
            call_args, call_kwargs = pack_inputs(values)
            result = self._call(method, call_args, call_kwargs)
            return outputs_plan.convert(
                result, lambda: f"{self._child_name()}: {method}()"
            )

        # numpy_function is py_func without the deprecation warning.
        outputs = tf.compat.v1.numpy_function(
            py_call,
            flat_inputs,
            [spec.dtype for spec in outputs_plan.flat_specs],
            stateful=True,
            name=f"{self._label}_{method}",
        )
        if specs is None:
            return outputs  # A tf.Operation (None when executing eagerly).
        if not isinstance(outputs, (list, tuple)):
            outputs = [outputs]  # Eager execution unwraps a single output.
        for tensor, spec in zip(outputs, outputs_plan.flat_specs, strict=True):
            tensor.set_shape(spec.shape)
        return tf.nest.pack_sequence_as(specs, outputs)


def _input_packer(args: tuple, kwargs: dict) -> tuple[Any, list]:
    """Flattens a proxy call's arguments for py_func; returns (unflatten, flat list).

    Plain tensor/value arguments take a fast path: tf.nest.pack_sequence_as is a
    noticeable part of a round trip (BENCHMARKS.md, "Figures from the code").
    """
    keys = sorted(kwargs)
    if any(tf.nest.is_nested(v) for v in (*args, *kwargs.values())):
        structure = (args, kwargs)

        def pack_nested(values: tuple) -> tuple[tuple, dict]:
            packed_args, packed_kwargs = tf.nest.pack_sequence_as(
                structure, list(values)
            )
            return tuple(packed_args), dict(packed_kwargs)

        return pack_nested, tf.nest.flatten(structure)
    num_args = len(args)

    def pack_flat(values: tuple) -> tuple[tuple, dict]:
        return tuple(values[:num_args]), dict(zip(keys, values[num_args:], strict=True))

    return pack_flat, [*args, *(kwargs[k] for k in keys)]


class _Outputs:
    """Checks and converts a method's results against its `_tensor_specs`.

    Built once per op (with TensorFlow, in the parent); `convert` runs per call and
    uses only numpy, several times cheaper than tf.nest and TensorShape.
    """

    def __init__(self, specs: Any, source: str):
        self.specs = specs
        self._spec_type = tf.TensorSpec
        self.flat_specs: list = []

        def collect(spec: Any) -> None:
            if isinstance(spec, tf.TensorSpec):
                self.flat_specs.append(spec)
            elif isinstance(spec, dict):
                for key in sorted(spec):
                    collect(spec[key])
            elif isinstance(spec, (tuple, list)):
                for item in spec:
                    collect(item)
            else:
                raise TypeError(
                    f"PyProcess: {source} must return None or a nest (tuples, lists, "
                    f"namedtuples, dicts) of tf.TensorSpec; found {spec!r}."
                )

        if specs is not None:
            collect(specs)
        # Per output: numpy dtype (None for tf.string), dims (None if rank unknown).
        self._dtypes = [
            None if s.dtype == tf.string else np.dtype(s.dtype.as_numpy_dtype)
            for s in self.flat_specs
        ]
        self._dtype_names = [s.dtype.name for s in self.flat_specs]
        self._dims = [
            None if s.shape.rank is None else tuple(s.shape.as_list())
            for s in self.flat_specs
        ]

    def _flatten(self, spec: Any, value: Any, out: list, where: str) -> None:
        # tf.nest's order: sequences (namedtuples too) in order, dicts by sorted key.
        if isinstance(spec, self._spec_type):
            out.append(value)
        elif isinstance(spec, dict):
            if not isinstance(value, dict) or set(value) != set(spec):
                raise PyProcessError(
                    f"{where} returned {_short_repr(value)}; its _tensor_specs "
                    f"declares a dict with keys {sorted(spec)}."
                )
            for key in sorted(spec):
                self._flatten(spec[key], value[key], out, where)
        else:
            if not isinstance(value, (tuple, list)) or len(value) != len(spec):
                raise PyProcessError(
                    f"{where} returned {_short_repr(value)}; its _tensor_specs "
                    f"declares a sequence of {len(spec)}: {spec}."
                )
            for spec_item, value_item in zip(spec, value, strict=True):
                self._flatten(spec_item, value_item, out, where)

    def convert(self, result: Any, describe: Any) -> list:
        """Returns the flat list of numpy arrays for py_func; `describe()` names the
        call in error messages (computed only on error)."""
        if self.specs is None:
            return []
        values: list = []
        try:
            self._flatten(self.specs, result, values, "")
        except PyProcessError as e:
            raise PyProcessError(f"{describe()}{e}") from None
        outputs = []
        for index, value in enumerate(values):
            wanted = self._dtypes[index]
            if wanted is None:
                array = np.asarray(value, dtype=object)
            else:
                array = np.asarray(value)
                if array.dtype != wanted:
                    if not np.can_cast(array.dtype, wanted, casting="same_kind"):
                        raise PyProcessError(
                            f"{describe()} returned {array.dtype} for output {index} "
                            f"of {len(values)}, which cannot be cast to the "
                            f"{self._dtype_names[index]} its _tensor_specs declares."
                        )
                    array = array.astype(wanted)
            dims = self._dims[index]
            if dims is not None and (
                len(dims) != array.ndim
                or any(
                    d is not None and d != n
                    for d, n in zip(dims, array.shape, strict=True)
                )
            ):
                raise PyProcessError(
                    f"{describe()} returned shape {list(array.shape)} for output "
                    f"{index} of {len(values)}; its _tensor_specs declares shape "
                    f"{list(dims)}."
                )
            outputs.append(array)
        return outputs


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Proxy:
    """Attribute access gives functions building ops; see PyProcess."""

    def __init__(self, process: PyProcess):
        self._process = process

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        process = self._process
        attribute = getattr(process._type, name, None)
        if attribute is None or not callable(attribute):
            raise AttributeError(
                f"PyProcess {process._label}: {process._label} has no method "
                f"{name!r} to call through the proxy."
            )

        def build(*args: Any, **kwargs: Any) -> Any:
            return process._build_op(name, args, kwargs)

        build.__name__ = name
        build.__doc__ = getattr(attribute, "__doc__", None)
        return build


class PyProcessHook(tf.compat.v1.train.SessionRunHook):
    """Starts every PyProcess of the graph in begin(), closes them at the end.

    Processes are taken from the collection PyProcess.COLLECTION of the default
    graph when begin() runs, and started in parallel; a constructor error is
    raised from begin() (so from the session's creation).

    MonitoredSession does not call end() when its `with` block exits with an
    exception, but always stops its coordinator when it closes. So the hook
    also registers a thread with the coordinator that closes the processes as
    soon as the coordinator stops: children end with the session, also after
    an error. When MonitoredSession re-creates its session (after a preemption
    error) after_create_session starts the processes again.
    """

    def __init__(self) -> None:
        self._processes: list[PyProcess] = []

    def begin(self) -> None:
        self._processes = list(tf.compat.v1.get_collection(PyProcess.COLLECTION))
        # Those already running were started by their owner (an actor's
        # environments, by its supervisor: actor/supervisor.py).
        start_all([p for p in self._processes if not p.alive])

    def after_create_session(self, session: Any, coord: Any) -> None:
        del session
        start_all([p for p in self._processes if not p.alive])
        if coord is None:
            return
        processes = list(self._processes)

        def close_on_stop() -> None:
            coord.wait_for_stop()
            close_all(processes)

        thread = threading.Thread(
            target=close_on_stop, daemon=True, name="py_process-close-on-stop"
        )
        coord.register_thread(thread)
        thread.start()

    def end(self, session: Any) -> None:
        del session
        close_all(self._processes)
