"""memfit.data.read.buffers: a batch handed to TensorFlow is taken back only once nothing views
it (RecyclingBuffers counts references), and pooled scratch is reused."""

import numpy as np
import tensorflow as tf

from memfit.data.read.buffers import ALIGN, BufferPool, RecyclingBuffers

F32 = np.dtype("float32")


def test_a_batch_still_viewed_is_never_handed_out_again():
    pool = RecyclingBuffers(keep=2)
    a = pool.array((4, 8), F32)
    a[...] = 1
    view = a[1:3]                       # what a consumer may keep: a slice of the batch
    del a
    later = [pool.array((4, 8), F32) for _ in range(3)]
    for b in later:
        b[...] = 2
        assert not np.shares_memory(view, b)
    assert (view == 1).all()


def test_a_batch_nothing_views_is_reused_aligned():
    pool = RecyclingBuffers(keep=1)
    a = pool.array((4, 8), F32)
    address = a.ctypes.data
    view = a.reshape(-1)[::2]           # a view of a view holds the buffer too
    del a
    assert pool.array((4, 8), F32).ctypes.data != address
    del view
    again = pool.array((4, 8), F32)
    assert again.ctypes.data == address and again.ctypes.data % ALIGN == 0


def test_a_tensor_that_wraps_a_batch_keeps_it_from_reuse():
    pool = RecyclingBuffers(keep=2)

    def batch(value):
        out = pool.array((64, 16), F32)
        out[...] = value
        return out

    first = tf.numpy_function(lambda: batch(1.0), [], tf.float32)
    for value in (2.0, 3.0, 4.0):
        tf.numpy_function(lambda v=value: batch(v), [], tf.float32)
    assert float(tf.reduce_min(first)) == float(tf.reduce_max(first)) == 1.0


def test_reserved_buffers_serve_later_arrays_without_new_memory():
    pool = RecyclingBuffers(keep=2)
    pool.reserve(4 * 8 * 4)
    spans = [(b.ctypes.data, b.ctypes.data + b.nbytes) for b in pool._bufs]
    held = [pool.array((4, 8), F32) for _ in range(2)]
    for x in held:
        assert any(lo <= x.ctypes.data < hi for lo, hi in spans)
    assert len(spans) == 2


def test_buffer_pool_reuses_a_set_that_fits():
    pool = BufferPool(lambda n: np.empty(n), lambda buf, n: len(buf) >= n)
    buf = pool.get(10)
    pool.put(buf)
    assert pool.get(5) is buf
    pool.put(buf)
    assert pool.get(20) is not buf
