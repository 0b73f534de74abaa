"""Shared pytest set-up.

TRITON_INTERPRET must be set before any Triton kernel is defined, so it is set here, at
collection time: every kernel test then runs on CPU through Triton's interpreter.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
