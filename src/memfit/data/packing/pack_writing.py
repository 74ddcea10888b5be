"""Writing and committing the files of a pack (both packers' shards and ``.npy`` files):
a file written under a temporary name with its sha256, direct where the file system allows
it (:class:`HashingWriter`), its bytes written in a background thread while the next are
prepared (:class:`WritePipe`), and finished files synced and renamed into place in another
(:class:`Committer`), each reported back as it lands (a pack records it in its state).

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> w = HashingWriter(folder / "a.bin")
    >>> w.write(b"half a file")
    11
    >>> w.abandon(); os.listdir(folder)      # a failed pack leaves nothing behind
    []
"""

from __future__ import annotations

import concurrent.futures as cf
import errno
import fcntl
import hashlib
import mmap
import os
import queue
import sys
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import IO, Any

from memfit.atomic import discard, temporary_name

__all__ = ["HashingWriter", "Committer", "WritePipe", "STAGING_BYTES", "ALIGN",
           "unguarded_script", "writer_died"]

# A HashingWriter's direct writes, two buffers of it per shard being written. 4 MiB held
# 8 MiB more than 2 MiB while packing, a working set a 0.25 GB source never filled
# (pack peak RSS 2 GiB ÷ 0.25 GiB 1.22 against 1.02, TFRecord files), and packed the
# 2 GiB arrays source no faster (2.83 s at 4 MiB, 2.60 s at 2 MiB, 5 interleaved rounds;
# issue 30).
STAGING_BYTES = 2 * 2**20
ALIGN = 4096                    # what O_DIRECT needs of addresses, sizes and offsets


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]


class HashingWriter:
    """A file written under a temporary name (``.tmp-<pid>-<name>``), hashing the bytes
    that land on disk, renamed into place when complete (:meth:`commit`) or deleted
    (:meth:`abandon`): a reader never sees half a file under its final name.

    Where the file system allows it, the file is written with ``O_DIRECT`` from a
    page-aligned staging buffer of :data:`STAGING_BYTES`, written by an I/O thread while
    the next bytes are hashed and staged in a second buffer (the bytes go to the disk
    without a copy in the page cache, whose upkeep cost this machine's kernel more than
    the disk took: 2 GiB written and fsynced in 1.2 s direct, 4.4-7.2 s buffered), the
    tail that does not fill a block written through the page cache; elsewhere (tmpfs...),
    buffered. The bytes, and their sha256, are the same either way.

    Example:
        >>> import tempfile
        >>> w = HashingWriter(Path(tempfile.mkdtemp()) / "a.bin")
        >>> w.write(b"memfit"), w.commit()[:12], w.path.read_bytes()
        (6, '294850f9e395', b'memfit')
    """

    def __init__(self, path: Path, direct: bool = True):
        self.path = path
        self.tmp = temporary_name(path)
        self._sha = hashlib.sha256()
        self.bytes = 0
        self._stages: list[mmap.mmap] = []
        self._staged = 0
        self._io: cf.ThreadPoolExecutor | None = None
        self._inflight: cf.Future | None = None
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        fd = -1
        if direct and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(self.tmp, flags | os.O_DIRECT, 0o666)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        if fd >= 0:
            self._file: IO[bytes] = open(fd, "wb", buffering=0)
            self._stages = [mmap.mmap(-1, STAGING_BYTES), mmap.mmap(-1, STAGING_BYTES)]
            self._io = cf.ThreadPoolExecutor(1, thread_name_prefix="memfit-direct")
        else:
            self._file = open(self.tmp, "wb")

    def write(self, data: Any) -> int:
        """Writes ``data`` (bytes or a buffer); returns its size (a file-like sink)."""
        self._sha.update(data)
        size = memoryview(data).nbytes
        if not self._stages:
            self._file.write(data)
        else:
            view = memoryview(data).cast("B")
            done = 0
            while done < size:
                n = min(size - done, STAGING_BYTES - self._staged)
                self._stages[0][self._staged:self._staged + n] = view[done:done + n]
                self._staged += n
                done += n
                if self._staged == STAGING_BYTES:
                    self._flip()
        self.bytes += size
        return size

    def _flip(self) -> None:
        """Writes the full staging buffer in the I/O thread (after the one before it) and
        stages the next bytes in the other buffer meanwhile."""
        assert self._io is not None
        self._wait()
        full = self._stages[0]
        self._inflight = self._io.submit(self._write_out, full, STAGING_BYTES)
        self._stages.reverse()
        self._staged = 0

    def _wait(self) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def _write_out(self, stage: mmap.mmap, n: int) -> None:
        """Writes the first ``n`` bytes of ``stage``: the whole blocks direct, the tail
        through the page cache."""
        fd = self._file.fileno()
        aligned = n - n % ALIGN
        try:
            _write_all(fd, memoryview(stage)[:aligned])
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self._buffered(fd)                  # a file system that refuses O_DIRECT writes
            _write_all(fd, memoryview(stage)[:aligned])
        if n > aligned:
            self._buffered(fd)
            _write_all(fd, memoryview(stage)[aligned:n])

    @staticmethod
    def _buffered(fd: int) -> None:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)

    def flush(self) -> None:
        """Flushes Python's buffer (direct: the staged bytes wait for :meth:`commit`)."""
        if not self._stages:
            self._file.flush()

    def drain(self) -> None:
        """Writes what is staged and unmaps the staging buffers: all that is left for
        :meth:`commit` is the sync and the rename. A pipe drains each file before its
        committer, which may still be syncing the file before, takes it: else every file
        waiting there kept its two buffers mapped (a pack held up to three files' worth,
        24 MiB, where one is needed)."""
        if self._stages:
            self._wait()
            self._write_out(self._stages[0], self._staged)
            self._release_stages()

    def commit(self) -> str:
        """Syncs the file and renames it into place; returns its sha256."""
        self.drain()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)
        return self._sha.hexdigest()

    def abandon(self) -> None:
        """Closes and deletes the temporary file."""
        try:
            self._wait()
        except OSError:
            pass
        discard(self._file, self.tmp)
        self._release_stages()

    def _release_stages(self) -> None:
        stages, self._stages = self._stages, []
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None
        for stage in stages:
            try:
                stage.close()
            except BufferError:     # a view of it lives on in a traceback: freed with it
                pass


class Committer:
    """Commits finished files in a background thread (``commit``: fsync, rename into
    place, as :meth:`HashingWriter.commit`), in the order they are handed over, while the
    caller writes the next ones; ``on_batch`` receives ``[(key, what commit returned)]``
    for the files committed since its last call, each time the thread catches up (a pack
    records them in its state once for several files when the disk is the slower side).

    A commit that fails stops the committer: the files handed over after it are deleted
    (their ``abandon``), :attr:`error` holds the exception and :meth:`close` raises it.
    Leaving a ``with`` block waits for every file handed over (after an interrupt, too:
    what was finished is kept, for a rerun to resume).

    Example:
        >>> import tempfile
        >>> done = []
        >>> with Committer(done.extend) as c:
        ...     w = HashingWriter(Path(tempfile.mkdtemp()) / "a.bin")
        ...     _ = w.write(b"memfit")
        ...     c.submit("a", w.commit, w.abandon)
        >>> done[0][0], done[0][1][:12]
        ('a', '294850f9e395')

    Args:
        on_batch: called in the committer's thread with the files committed, in order.
    """

    def __init__(self, on_batch: Callable[[list[tuple[Hashable, Any]]], None]):
        self.on_batch = on_batch
        self.error: BaseException | None = None
        self._queue: queue.Queue[tuple[Hashable, Callable[[], Any], Callable[[], None]]
                                 | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="memfit-commit", daemon=True)
        self._thread.start()

    def submit(self, key: Hashable, commit: Callable[[], Any],
               abandon: Callable[[], None]) -> None:
        """Hands over a file whose every byte is written: ``commit()`` syncs and renames it
        (its result goes to ``on_batch`` with ``key``), ``abandon()`` deletes it instead."""
        self._queue.put((key, commit, abandon))

    def _run(self) -> None:
        batch: list[tuple[Hashable, Any]] = []
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, commit, abandon = item
            if self.error is not None:
                abandon()
                continue
            try:
                batch.append((key, commit()))
                if self._queue.empty() or self._queue.queue[0] is None:
                    done, batch = batch, []
                    self.on_batch(done)
            except BaseException as e:                  # close() raises it
                self.error = e
                abandon()
                done, batch = batch, []     # committed before the failure: still reported
                if done:
                    try:
                        self.on_batch(done)
                    except BaseException:   # noqa: BLE001 -- the first error is raised
                        pass

    def close(self) -> None:
        """Waits for every file handed over; raises the first commit's error, if any."""
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def __enter__(self) -> Committer:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is None:
            self.close()
            return
        self._queue.put(None)                   # interrupted: finish what was handed over
        self._thread.join()


class WritePipe:
    """Overlaps preparing a file's bytes with writing them: the caller hands over work
    (:meth:`put`: a function that writes, say, a piece of records into a
    :class:`HashingWriter`, which hashes as it writes; hashlib and the file write release
    the GIL on large buffers), a writer thread runs it in order while the caller prepares
    the next piece, and a :class:`Committer` syncs and renames each finished file
    (:meth:`complete`), then reports it to ``on_batch``. At most one piece of work waits
    between the caller and the writer thread.

    Leaving the ``with`` block waits for all of it; an error in a thread stops the pipe
    (the caller's next :meth:`put` raises it, else the end of the block does). After an
    interrupt, the files completed are still committed (a rerun keeps them) and those
    not completed are deleted.

    Example:
        >>> import tempfile
        >>> done = []
        >>> with WritePipe(done.extend) as pipe:
        ...     w = HashingWriter(Path(tempfile.mkdtemp()) / "a.bin")
        ...     pipe.adopt(w)
        ...     pipe.put(lambda: w.write(b"memfit"))
        ...     pipe.complete(w, "a", lambda: None, w.commit)
        >>> done[0][0], done[0][1][:12]
        ('a', '294850f9e395')

    Args:
        on_batch: receives ``[(key, what commit returned)]`` in the committer's thread.
    """

    def __init__(self, on_batch: Callable[[list[tuple[Hashable, Any]]], None]):
        self.committer = Committer(on_batch)
        self.error: BaseException | None = None
        self._pending: set[HashingWriter] = set()   # handed to the pipe, not committed
        self._queue: queue.Queue[Callable[[], Any] | None] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name="memfit-write", daemon=True)
        self._thread.start()

    def adopt(self, writer: HashingWriter) -> None:
        """From now on the pipe commits ``writer`` (once completed) or deletes it."""
        self._pending.add(writer)

    def put(self, work: Callable[[], Any]) -> None:
        """Runs ``work()`` in the writer thread after the work before it; raises the
        error that stopped a thread of the pipe."""
        for error in (self.error, self.committer.error):
            if error is not None:
                raise error
        self._queue.put(work)

    def complete(self, writer: HashingWriter, key: Hashable, finish: Callable[[], None],
                 commit: Callable[[], Any]) -> None:
        """After the work handed over, ``finish()`` (the last bytes) and the writer
        drained (:meth:`HashingWriter.drain`), then the committer runs ``commit()`` (sync
        and rename; its result goes to ``on_batch`` as ``key``)."""
        def hand_over() -> None:
            finish()
            writer.drain()
            self._pending.discard(writer)
            self.committer.submit(key, commit, writer.abandon)

        self.put(hand_over)

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            if self.error is not None or self.committer.error is not None:
                continue                                # deleted when the pipe closes
            try:
                work()
            except BaseException as e:                  # the caller raises it
                self.error = e

    def __enter__(self) -> WritePipe:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        self._queue.put(None)
        self._thread.join()
        for writer in self._pending:
            writer.abandon()
        self._pending.clear()
        if kind is not None:
            self.committer.__exit__(kind, value, tb)
            return
        self.committer.close()
        if self.error is not None:
            raise self.error


# -- the writer processes of workers > 1 -----------------------------------------------

def unguarded_script() -> str | None:
    """What is wrong when the ``__main__`` module is a script without a ``__main__`` guard
    (``None`` when it is not): each writer process starts by importing it (spawn), and so
    would pack again there."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if not script or getattr(main, "__spec__", None) is not None:
        return None
    try:
        text = Path(script).read_text(errors="replace")
    except OSError:
        return None
    if "__main__" in text:
        return None
    return (f"each writer starts by importing {script!r}, which packs again there. Put the "
            f"script's work under `if __name__ == \"__main__\":`, or pass workers=1.")


def writer_died(workers: int) -> str:
    """What to say when a writer process died."""
    return f"A writer process of memfit.pack (workers={workers}) died (killed? out of memory?)."
