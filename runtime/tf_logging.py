"""TensorFlow's own output, cut to what a user of experiment.py needs.

`import_tensorflow_quietly` imports TensorFlow with TF_CPP_MIN_LOG_LEVEL at 2
unless the user set it: INFO and WARNING lines of the C++ runtime hidden,
errors shown. TensorFlow 2.21 prints some lines before its runtime reads
that variable (absl's "All log messages before absl::InitializeLog()..."
notice and the oneDNN notice, each twice), so the import runs with file
descriptor 2 redirected to a temporary file and what it wrote is passed on
without the lines below that level. TF_CPP_MIN_LOG_LEVEL=0 shows them all.

The import also leaves Keras out. TensorFlow's `__init__` imports
`keras.src.optimizers` eagerly (only to register Keras' optimizers for
SavedModel) and goes on without it when that raises ImportError. This
program uses no Keras (graph mode, v1 optimizers, Sonnet), and importing
Keras is about a quarter of importing TensorFlow's CPU time (4.0 s to 2.9 s
here, measured under load), paid by every learner, actor task and test-mode
process. So while TensorFlow imports, Keras is found (its directory is
where TensorFlow looks for `tf.keras`) but not run; `tf.keras` still
imports it on first use.

`quiet_tensorflow_logging` then keeps TensorFlow's Python logger from
printing every line twice and from deprecation notices of the v1 APIs used
on purpose.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile
from typing import Any

# absl/glog-style line prefixes: I (info), W (warning), E (error), F (fatal),
# then the date: "I0000 00:00:1796110775.439748 15293 port.cc:153] ...".
_LOG_LINE = re.compile(r"^([IWEF])\d{4} ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
# absl's notice before its logging is set up; a warning.
_PRE_INIT_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"


def visible_lines(text: str, min_level: int) -> list[str]:
    """The lines of `text` to show at TF_CPP_MIN_LOG_LEVEL `min_level`.

    A log line below the level is dropped with the lines that continue it
    (lines without a log prefix right after it); anything else stays.
    """
    shown, hiding = [], False
    for line in text.splitlines(keepends=True):
        match = _LOG_LINE.match(line)
        if match:
            hiding = _SEVERITY[match.group(1)] < min_level
        elif line.startswith(_PRE_INIT_NOTICE):
            hiding = _SEVERITY["W"] < min_level
        elif not hiding or not line.strip():
            hiding = False
        if not hiding:
            shown.append(line)
    return shown


def min_log_level() -> int:
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


class _KerasNotRun(importlib.abc.Loader):
    """Refuses to run Keras: TensorFlow's eager import of it gives up."""

    def create_module(self, spec: Any) -> None:
        raise ImportError("Keras is left out while TensorFlow imports")

    def exec_module(self, module: Any) -> None:
        raise ImportError("Keras is left out while TensorFlow imports")


class _FindKerasWithoutRunningIt(importlib.abc.MetaPathFinder):
    """Keras' real spec (its origin, for TensorFlow's path lookups), not run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "keras":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _KerasNotRun()
        return spec


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow (see the module docstring); a no-op once imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    finder = _FindKerasWithoutRunningIt()
    with tempfile.TemporaryFile() as capture:
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        sys.meta_path.insert(0, finder)
        try:
            import tensorflow  # noqa: F401
        finally:
            sys.meta_path.remove(finder)
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            sys.stderr.writelines(visible_lines(text, min_log_level()))
            sys.stderr.flush()


def quiet_tensorflow_logging() -> None:
    """One copy of each log line, and no deprecation notices for v1 APIs.

    TensorFlow's Python logger has its own handler and also propagates to
    absl's, which prints every line twice; the graph-mode APIs this program
    uses on purpose (queue runners, v1 optimizers) each print a deprecation
    notice.
    """
    import tensorflow as tf
    from tensorflow.python.util import deprecation

    tf.get_logger().handlers.clear()
    deprecation._PRINT_DEPRECATION_WARNINGS = False  # noqa: SLF001
