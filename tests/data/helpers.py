"""Shared helpers of the data tests: small sources and reading a dataset back."""

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
