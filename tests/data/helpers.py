"""Shared helpers of the data tests: small sources, reading a dataset back, and what
TensorFlow logged in a child's stderr."""

import os
import re

import numpy as np


def small_arrays(n=300, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.random((n, 4, 3), dtype=np.float32),
            "y": rng.integers(0, 10, n).astype(np.int64),
            "id": np.arange(n, dtype=np.int64)}


def read_all(path, **kw):
    """Every sample of one pass of memfit.dataset, as a dict of stacked arrays."""
    import memfit

    kw.setdefault("batch_size", 64)
    ds = memfit.dataset(path, **kw)
    batches = [{k: v.numpy() for k, v in b.items()} for b in ds]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}, batches


def by_id(columns):
    order = np.argsort(columns["id"])
    return {k: v[order] for k, v in columns.items()}


# A line TensorFlow's C++ side writes to stderr: absl's format ("W0000 00:00:1796607264.35
# 16776 op_kernel.cc:1845] "), TensorFlow's older one ("2025-09-17 14:44:05.1: I external/…]
# "), and the two start-up lines without a prefix.
_TF_LOG_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] |"
                          r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |"
                          r"WARNING: All log messages before absl::InitializeLog\(\)|"
                          r"To enable the following instructions: ")


def tensorflow_lines(stderr):
    """The lines of ``stderr`` that TensorFlow's C++ side logged."""
    return [line for line in stderr.splitlines() if _TF_LOG_LINE.match(line)]


def user_env(**extra):
    """The environment a user's shell gives a child: TF_CPP_MIN_LOG_LEVEL unset (the
    tests' conftest sets it), so TensorFlow logs all it logs by default."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(extra)
    return env
