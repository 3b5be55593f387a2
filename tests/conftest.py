"""Shared pytest set-up: quiet TensorFlow and make the repository importable."""

import os
import sys

# TensorFlow reads these at import time, so they must be set before any test
# module imports it. Level 2 hides INFO and WARNING lines from the C++ runtime.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
