"""The overlapped stages of a pack (issue 28): rows gathered with pread, records framed
as pieces, hashed and written by a writer thread, files written direct and committed in
the background. Each must give the bytes the plain, one-stage path gives."""

import hashlib
import os
import threading
from pathlib import Path

import numpy as np
import pytest

import memfit
from memfit.data.format.manifest import Feature
from memfit.data.packing import pack_options, pack_shards, pack_writing
from memfit.data.packing.pack_options import gather
from memfit.data.packing.pack_shards import ShardWriter, encode_block, write_shard
from memfit.data.packing.pack_writing import Committer, HashingWriter, WritePipe
from memfit.data.sources.columns import ArraySource
from memfit.data.sources.opening import open_source


def _npy_source(tmp_path, rows=300, shape=(32, 32, 3), fortran=False):
    rng = np.random.default_rng(7)
    x = rng.random((rows, *shape), dtype=np.float32)
    np.save(tmp_path / "x.npy", np.asfortranarray(x) if fortran else x)
    np.save(tmp_path / "y.npy", rng.integers(0, 10, rows))
    return {"x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")}


@pytest.mark.parametrize("fortran", [False, True])
def test_gather_reads_the_rows_take_reads(tmp_path, monkeypatch, fortran):
    # every column above the mapped-column size: the pread path (or, in Fortran order,
    # the fallback to take)
    monkeypatch.setattr(pack_options, "_MAPPED_COLUMN_BYTES", 0)
    src = open_source(_npy_source(tmp_path, fortran=fortran))
    idx = np.random.default_rng(1).permutation(300)[:77]
    got, want = gather(src, idx), src.take(idx)
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_array_equal(got[name], want[name])


def test_gather_reads_big_rows_with_pread_and_small_columns_through_the_map(
        tmp_path, monkeypatch):
    monkeypatch.setattr(pack_options, "_MAPPED_COLUMN_BYTES", 1000)  # y (2.4 KB) is not
    src = open_source(_npy_source(tmp_path))
    calls = []
    real = os.preadv
    monkeypatch.setattr(pack_options.os, "preadv",
                        lambda fd, bufs, off: calls.append(off) or real(fd, bufs, off))
    idx = np.array([5, 299, 0, 17])
    gather(src, idx)                        # y has 8-byte rows, too many: all of src.take
    assert calls == []
    monkeypatch.setattr(pack_options, "_MAPPED_COLUMN_BYTES", 4000)  # y is mapped now
    got = gather(src, idx)
    assert len(calls) == 4                  # one pread per row of x
    np.testing.assert_array_equal(got["x"], src.take(idx)["x"])
    np.testing.assert_array_equal(got["y"], src.take(idx)["y"])


def test_gather_of_a_file_that_shrank_is_a_clear_error(tmp_path, monkeypatch):
    # x (12 KiB rows) read with pread, y (2.4 KB) through its map: no page of the
    # shortened x is touched through a map (that would be SIGBUS, not an error)
    monkeypatch.setattr(pack_options, "_MAPPED_COLUMN_BYTES", 4000)
    paths = _npy_source(tmp_path)
    src = open_source(paths)
    os.truncate(paths["x"], os.path.getsize(paths["x"]) - 12288 * 10)
    with pytest.raises(memfit.DatasetError, match="got shorter"):
        gather(src, np.array([0, 299]))


def test_a_shard_framed_as_pieces_is_the_shard_framed_whole(tmp_path):
    """write_shard (records as views of the gathered rows, one CRC call for all) writes
    what ShardWriter.add(encode_block(...)) writes, record by record."""
    rng = np.random.default_rng(3)
    src = ArraySource({"x": rng.random((101, 5, 3), dtype=np.float32).astype(">f4"),
                       "y": rng.integers(0, 9, 101).astype(np.int16)})
    idx = rng.permutation(101)
    for k in (1, 4, 7, 200):
        shard, raw = write_shard(src, idx, tmp_path / f"a{k}.tfrecord", k, None)
        plain = ShardWriter(tmp_path / f"b{k}.tfrecord", None)
        rows = src.take(idx)
        for a in range(0, 101, k):
            payload, raw_bytes = encode_block({n: c[a:a + k] for n, c in rows.items()},
                                              src.features)
            plain.add(payload, len(idx[a:a + k]), raw_bytes)
        ref, ref_raw = plain.close()
        assert (tmp_path / f"a{k}.tfrecord").read_bytes() == \
            (tmp_path / f"b{k}.tfrecord").read_bytes()
        assert (shard.sha256, shard.records, shard.samples, raw) == \
            (ref.sha256, ref.records, ref.samples, ref_raw)


@pytest.mark.parametrize("direct", [True, False])
def test_direct_and_buffered_writers_write_the_same_bytes_and_sha256(tmp_path, direct,
                                                                     monkeypatch):
    monkeypatch.setattr(pack_writing, "STAGING_BYTES", 8192)   # many buffers, and a tail
    rng = np.random.default_rng(0)
    pieces = [rng.bytes(int(n)) for n in rng.integers(0, 30000, 40)] + [b"x"]
    w = HashingWriter(tmp_path / "f.bin", direct=direct)
    assert bool(w._stages) == (direct and hasattr(os, "O_DIRECT") and not _refuses_direct(
        tmp_path))
    for p in pieces:
        w.write(memoryview(p))
    sha = w.commit()
    data = b"".join(pieces)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert sha == hashlib.sha256(data).hexdigest()
    assert os.listdir(tmp_path) == ["f.bin"]


def test_a_file_handed_to_a_busy_committer_holds_no_staging_buffers(tmp_path, monkeypatch):
    """The pipe drains each file (its staged bytes written, its buffers unmapped) before
    the committer takes it: files queued behind a slow fsync hold no buffers, and the
    bytes and sha256 are the same."""
    monkeypatch.setattr(pack_writing, "STAGING_BYTES", 8192)
    gate, done = threading.Event(), []
    writers = [HashingWriter(tmp_path / f"f{i}.bin") for i in range(3)]
    data = [np.random.default_rng(i).bytes(20000 + i) for i in range(3)]
    assert all(w._stages for w in writers) or _refuses_direct(tmp_path)

    def slow_commit(w):
        def commit():
            gate.wait(5)
            return w.commit()
        return commit

    with WritePipe(done.extend) as pipe:
        for i, w in enumerate(writers):
            pipe.adopt(w)
            pipe.put(lambda w=w, d=data[i]: w.write(d))
            pipe.complete(w, i, lambda: None, slow_commit(w))
        pipe.put(lambda: None)                  # the writer thread is past every hand-over
        pipe.put(lambda: None)
        assert not done and all(not w._stages for w in writers)
        gate.set()
    assert [k for k, _ in done] == [0, 1, 2]
    for i, (_, sha) in enumerate(done):
        assert (tmp_path / f"f{i}.bin").read_bytes() == data[i]
        assert sha == hashlib.sha256(data[i]).hexdigest()


def _refuses_direct(directory: Path) -> bool:
    try:
        os.close(os.open(directory / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
        return False
    except OSError:
        return True
    finally:
        (directory / "probe").unlink(missing_ok=True)


def test_a_file_system_that_refuses_direct_writes_gets_buffered_ones(tmp_path, monkeypatch):
    import errno
    real, refused = os.write, []

    def write(fd, data):
        import fcntl
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(1)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data)

    monkeypatch.setattr(pack_writing, "STAGING_BYTES", 8192)
    monkeypatch.setattr(pack_writing.os, "write", write)
    w = HashingWriter(tmp_path / "f.bin")
    if not w._stages:
        pytest.skip("this file system refuses O_DIRECT at open")
    w.write(b"a" * 20000)
    sha = w.commit()
    assert refused and (tmp_path / "f.bin").read_bytes() == b"a" * 20000
    assert sha == hashlib.sha256(b"a" * 20000).hexdigest()


def test_committer_keeps_the_order_and_stops_at_a_failed_commit(tmp_path):
    batches = []
    writers = [HashingWriter(tmp_path / f"{i}.bin") for i in range(4)]
    for i, w in enumerate(writers):
        w.write(bytes([i]) * 10)

    def fails():
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        with Committer(batches.extend) as c:
            c.submit(0, writers[0].commit, writers[0].abandon)
            c.submit(1, fails, writers[1].abandon)
            c.submit(2, writers[2].commit, writers[2].abandon)
    writers[3].abandon()
    assert [k for k, _ in batches] == [0]
    assert sorted(os.listdir(tmp_path)) == ["0.bin"]        # 1 and 2 deleted, not renamed


def test_write_pipe_runs_work_in_order_in_another_thread_and_commits(tmp_path):
    seen, done = [], []
    with WritePipe(done.extend) as pipe:
        w = HashingWriter(tmp_path / "a.bin")
        pipe.adopt(w)
        for i in range(5):
            pipe.put(lambda i=i: seen.append((i, threading.current_thread().name))
                     or w.write(bytes([i])))
        pipe.complete(w, "a", lambda: None, w.commit)
    assert [i for i, _ in seen] == list(range(5))
    assert all(name == "memfit-write" for _, name in seen)
    assert (tmp_path / "a.bin").read_bytes() == bytes(range(5))
    assert done == [("a", hashlib.sha256(bytes(range(5))).hexdigest())]


def test_write_pipe_raises_a_writer_error_and_deletes_what_was_not_completed(tmp_path):
    done = []
    with pytest.raises(OSError, match="disk broke"):
        with WritePipe(done.extend) as pipe:
            first = HashingWriter(tmp_path / "first.bin")
            pipe.adopt(first)
            pipe.put(lambda: first.write(b"ok"))
            pipe.complete(first, "first", lambda: None, first.commit)
            second = HashingWriter(tmp_path / "second.bin")
            pipe.adopt(second)

            def broken():
                raise OSError(5, "disk broke")

            pipe.put(broken)
            for _ in range(100):        # the error comes back at a later hand-over
                pipe.put(lambda: second.write(b"never"))
    assert [k for k, _ in done] == ["first"]
    assert sorted(os.listdir(tmp_path)) == ["first.bin"]


def test_interrupted_pipe_keeps_completed_shards_and_deletes_the_open_one(tmp_path):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with WritePipe(done.extend) as pipe:
            for name in ("a", "b"):
                w = HashingWriter(tmp_path / f"{name}.bin")
                pipe.adopt(w)
                pipe.put(lambda w=w: w.write(b"data"))
                pipe.complete(w, name, lambda: None, w.commit)
            open_one = HashingWriter(tmp_path / "c.bin")
            pipe.adopt(open_one)
            pipe.put(lambda: open_one.write(b"half"))
            raise KeyboardInterrupt
    assert [k for k, _ in done] == ["a", "b"]
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_pack_of_big_npy_rows_matches_the_pack_of_the_same_arrays_in_memory(tmp_path,
                                                                            monkeypatch):
    """The .npy path (pread gather, direct writes) and the in-memory path (take) agree
    byte for byte, the manifest's source description aside."""
    monkeypatch.setattr(pack_options, "_MAPPED_COLUMN_BYTES", 0)
    paths = _npy_source(tmp_path, rows=500)
    arrays = {k: np.load(v) for k, v in paths.items()}
    a = memfit.pack(paths, tmp_path / "a", shards=4, seed=2, progress=False)
    b = memfit.pack(arrays, tmp_path / "b", shards=4, seed=2, progress=False)
    sa = [s.sha256 for s in a.manifest.splits["train"].shards]
    assert sa == [s.sha256 for s in b.manifest.splits["train"].shards]
    assert memfit.verify(tmp_path / "a").ok


def test_a_pack_interrupted_while_its_last_shard_is_committed_resumes(tmp_path, monkeypatch):
    """Interrupted in the committer's first state save (its shards renamed, not yet
    recorded): the rerun rewrites what it cannot trust and equals an uninterrupted pack,
    with no stray file."""
    arrays = {"x": np.random.default_rng(0).random((800, 16), np.float32)}
    ref = memfit.pack(arrays, tmp_path / "ref", shards=4, progress=False)
    real, calls = pack_shards._Finished.record_batch, []

    def dies(self, results):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(self, results)

    monkeypatch.setattr(pack_shards._Finished, "record_batch", dies)
    with pytest.raises(KeyboardInterrupt):
        memfit.pack(arrays, tmp_path / "d", shards=4, progress=False)
    monkeypatch.setattr(pack_shards._Finished, "record_batch", real)
    r = memfit.pack(arrays, tmp_path / "d", shards=4, progress=False)
    assert r.samples == 800
    assert sorted(os.listdir(tmp_path / "d")) == sorted(os.listdir(tmp_path / "ref"))
    assert [s.sha256 for s in r.manifest.splits["train"].shards] == \
        [s.sha256 for s in ref.manifest.splits["train"].shards]


def test_encode_block_is_unchanged_for_a_fixed_feature():
    payload, raw = encode_block({"x": np.zeros((2, 3), "float32")},
                                {"x": Feature("x", "float32", (3,))})
    assert (raw, len(payload)) == (24, 37)
