"""Allocator retention measured without a trim: glibc's free bytes beside RSS (mallinfo2)."""

import json
import subprocess
import sys

import pytest

from memfit.memory.allocator import malloc_free
from memfit.memory.classifier import classify

MiB = 2**20
glibc = pytest.mark.skipif(malloc_free() is None, reason="needs glibc 2.33+ (mallinfo2)")

# A child that frees 64 MiB of touched 1 MiB chunks below a block still in use (so that glibc
# cannot shrink its heap): RSS keeps them, and so must glibc's free bytes.
CHILD = r"""
import ctypes, json
from memfit.memory.allocator import malloc_free
from memfit.memory.probe import sample
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt(-3, 16 * 2**20)            # M_MMAP_THRESHOLD: 1 MiB chunks come from the heap
chunks = [libc.malloc(2**20) for _ in range(64)]
for c in chunks:
    ctypes.memset(c, 1, 2**20)
pin = libc.malloc(2 * 2**20)            # from the top, above them: the heap cannot shrink
before = (sample().rss_anon, malloc_free())
for c in chunks:
    libc.free(c)
after = (sample().rss_anon, malloc_free())
print(json.dumps({"before": before, "after": after}))
"""


@glibc
def test_free_bytes_grow_by_what_was_freed_and_kept():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=60, check=True)
    r = json.loads(out.stdout)
    (rss0, free0), (rss1, free1) = r["before"], r["after"]
    assert free1 - free0 >= 60 * MiB, r           # 64 MiB freed, held by glibc ...
    assert rss1 - rss0 > -8 * MiB, r               # ... and still resident


def test_growth_that_glibc_holds_free_is_retention_not_a_leak():
    rss = [600 * MiB + 25 * MiB * i for i in range(8)]
    free = [40 * MiB + 24 * MiB * i for i in range(8)]     # the same climb, freed
    v = classify(rss, warmup_epochs=1, held=free, trim_probe=lambda: 0)
    assert v.kind == "allocator-retention", v
    assert v.held == 6 * 24 * MiB and v.released == 0
    assert "glibc's free bytes +144.0 MiB" in v.headline
    assert "mallinfo2" in v.explanation and "not one" in v.explanation
    assert v.to_record()["held"] == v.held


def test_growth_in_use_stays_a_leak_and_a_short_series_is_ignored():
    rss = [600 * MiB + 25 * MiB * i for i in range(8)]
    flat = [40 * MiB + (i % 2) * MiB for i in range(8)]    # free bytes do not follow
    v = classify(rss, warmup_epochs=1, held=flat, trim_probe=lambda: 0)
    assert v.kind == "leak" and v.held is not None and v.held < 2 * MiB, v
    climb = [40 * MiB + 24 * MiB * i for i in range(7)]    # one value short: not beside rss
    assert classify(rss, warmup_epochs=1, held=climb).kind == "leak"
    assert classify(rss, warmup_epochs=1, held=climb).held is None
    level = [600 * MiB + (i % 2) * MiB for i in range(8)]
    assert classify(level, warmup_epochs=1, held=[MiB * 30 * i for i in range(8)]).kind \
        == "stable"                                          # no growth: nothing to explain


def test_growth_of_the_bytes_in_use_is_a_leak_whatever_a_trim_gives_back():
    """On JAX a stranger's script kept 19 MiB more NumPy data every epoch, and the doctor
    said "No memory problem": a trim gave back 36 MiB of other free memory (XLA's), more
    than half the 39 MiB growth, so it was called retention. glibc's bytes in use grew by
    the growth: live allocations hold it, and no trim says otherwise."""
    rss = [300 * MiB + 19 * MiB * i for i in range(8)]
    used = [100 * MiB + 19 * MiB * i for i in range(8)]     # handed out, not back
    v = classify(rss, warmup_epochs=1, trim_probe=lambda: 36 * MiB, in_use=used)
    assert v.kind == "leak" and v.in_use == 6 * 19 * MiB and v.released == 36 * MiB, v
    assert "live allocations hold the memory" in v.explanation
    assert "glibc's bytes in use +114.0 MiB; malloc_trim gave back 36.0 MiB" in v.headline
    assert v.to_record()["in_use"] == v.in_use
    # the same growth with the bytes in use flat: the trim decides, as before
    flat = [100 * MiB + (i % 2) * MiB for i in range(8)]
    v = classify(rss, warmup_epochs=1, trim_probe=lambda: 100 * MiB, in_use=flat)
    assert v.kind == "allocator-retention" and v.released == 100 * MiB, v
    v = classify(rss, warmup_epochs=1, held=[40 * MiB + 24 * MiB * i for i in range(8)],
                 in_use=used)
    assert v.kind == "leak", v                               # free bytes cannot undo it


@glibc
def test_the_bytes_in_use_count_what_numpy_keeps():
    import numpy as np

    from memfit.memory.allocator import malloc_in_use

    before = malloc_in_use()
    kept = [np.ones(2_500_000) for _ in range(3)]            # 19.1 MiB each, as on JAX
    assert malloc_in_use() - before >= 57 * MiB and len(kept) == 3
