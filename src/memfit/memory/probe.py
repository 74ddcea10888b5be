"""The one memory probe: every number memfit reports about a process comes from here.

Resident memory is split the way the kernel accounts it: anonymous pages (the heap,
NumPy and TensorFlow buffers: what running out of memory is about) and file-backed
pages (memory-mapped files and shared libraries: page cache the kernel can drop, not a
leak). On Linux the split is read from ``/proc/<pid>/status``; elsewhere only the total
is known and the parts are reported as absent (``None``), never as zero.

Example:
    >>> s = sample()
    >>> s.rss >= s.rss_anon
    True
    >>> with measure() as m:
    ...     block = bytearray(64 * 2**20)
    >>> m.peak.rss_anon - m.before.rss_anon >= 60 * 2**20
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import platform
import threading
import time
from collections.abc import Iterator

import psutil

from memfit import checks
from memfit.sizes import format_size

__all__ = ["Sample", "Measurement", "sample", "measure", "peak_of", "python_heap", "tf_gpu_memory",
           "jax_device_memory", "device_stats", "nvml_memory", "extended_record",
           "shares_memory", "oom_kills"]

_STATUS_FIELDS = {"VmRSS": "rss", "RssAnon": "rss_anon", "RssFile": "rss_file",
                  "RssShmem": "rss_shmem", "VmHWM": "rss_peak"}


@dataclasses.dataclass(frozen=True)
class Sample:
    """Resident memory of a process (or a process tree) at one instant, in bytes.

    Attributes:
        t: wall-clock time of the sample (``time.time()``).
        pid: the process sampled (the root, for a tree).
        rss: total resident set size.
        rss_anon: anonymous resident memory, or ``None`` where the OS does not say.
        rss_file: file-backed resident memory (mapped files, libraries), or ``None``.
        rss_shmem: shared-memory resident pages, or ``None``.
        rss_peak: the kernel's high-water mark of ``rss`` (VmHWM), or ``None``.
        processes: how many processes were summed.
    """

    t: float
    pid: int
    rss: int
    rss_anon: int | None
    rss_file: int | None
    rss_shmem: int | None = None
    rss_peak: int | None = None
    processes: int = 1

    def as_record(self) -> dict:
        """The sample as a dict for the JSON-lines log (absent sources omitted)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @property
    def anon_or_total(self) -> int:
        """Anonymous RSS where known, else total RSS: the number budgets are about."""
        return self.rss if self.rss_anon is None else self.rss_anon


def _read_status(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return _parse_status(f.read().decode("ascii", "replace"))
    except OSError:
        return None


def _parse_status(text: str) -> dict[str, int] | None:
    """The memory fields of a ``/proc/<pid>/status`` text, in bytes; ``None`` for a
    zombie (it ended: there is nothing left to sample).

    Any other process with no address space prints no ``Vm*``/``Rss*`` lines: one in
    the middle of exiting (its memory already released, not yet a zombie) or a kernel
    thread. It holds no user memory, so it reads as zeros -- not as "unknown", which
    would drop the anonymous/file split from a sample taken as a job ends.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key == "State" and rest.split()[:1] in (["Z"], ["X"]):
            return None
        if key == "PPid":
            out["ppid"] = int(rest.split()[0])
            continue
        field = _STATUS_FIELDS.get(key)
        if field:
            out[field] = int(rest.split()[0]) * 1024   # the kernel prints kB
    if "rss" not in out:
        out = {"rss": 0, "rss_anon": 0, "rss_file": 0, "rss_shmem": 0,
               **({"ppid": out["ppid"]} if "ppid" in out else {})}
    return out


_KCMP = {"x86_64": 312, "aarch64": 272, "arm64": 272}.get(platform.machine())
_KCMP_VM = 1


def shares_memory(a: int, b: int) -> bool:
    """Whether processes ``a`` and ``b`` share one address space (Linux ``kcmp``).

    A child started with ``vfork`` (CPython's ``subprocess`` uses it) runs in its
    parent's memory until it executes its program: for that instant ``/proc`` shows the
    parent's whole memory as the child's too, and a tree that counted both would read
    twice its size. ``False`` where the kernel cannot tell (no ``kcmp``, not permitted).

    Example:
        >>> shares_memory(os.getpid(), os.getpid())
        True
    """
    libc = _libc()
    if _KCMP is None or libc is None:
        return False
    return libc.syscall(_KCMP, a, b, _KCMP_VM, 0, 0) == 0


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """This process's C library, loaded once (:func:`shares_memory` runs per descendant
    per sample)."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _one(pid: int) -> Sample:
    status = _read_status(pid)
    if status is not None:
        return Sample(t=time.time(), pid=pid, rss=status["rss"],
                      rss_anon=status.get("rss_anon"), rss_file=status.get("rss_file"),
                      rss_shmem=status.get("rss_shmem"), rss_peak=status.get("rss_peak"))
    process = psutil.Process(pid)
    if process.status() == psutil.STATUS_ZOMBIE:    # it ended: no memory left to sample
        raise psutil.NoSuchProcess(pid)
    info = process.memory_info()
    return Sample(t=time.time(), pid=pid, rss=info.rss, rss_anon=None, rss_file=None)


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def system_memory() -> tuple[int, int]:
    """``(total, available)`` bytes of this machine's RAM (``available``: what new
    processes can get without swapping, as the kernel estimates it)."""
    info = psutil.virtual_memory()
    return int(info.total), int(info.available)


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot, on this machine
    and in every cgroup (``oom_kill`` of ``/proc/vmstat``); ``None`` where it does not say
    (not Linux, or a kernel before 4.13). Unchanged across a process's SIGKILL: someone
    else sent it.

    Example:
        >>> before = oom_kills()
        >>> before is None or before >= 0
        True
    """
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def descendants(pid: int, *, below: int = 0) -> list[int]:
    """The pids of every process below ``pid`` (children, theirs...); ``[]`` if it is gone.

    The one place that walks a process tree: sampling a tree, its GPU memory, and
    killing a tree (:func:`memfit.memory.process.kill_tree`) all go through it.

    Args:
        pid: the root.
        below: leave out the first ``below`` levels (1: not ``pid``'s own children, only
            theirs and further down).
    """
    try:
        level = psutil.Process(pid).children()
        for _ in range(below):
            level = [c for p in level for c in _children(p)]
        return [c.pid for p in level for c in [p, *_children(p, recursive=True)]]
    except psutil.Error:
        return []


def _children(process: psutil.Process, recursive: bool = False) -> list[psutil.Process]:
    try:
        return process.children(recursive=recursive)
    except psutil.Error:            # it ended while the tree was walked
        return []


def sample(pid: int | None = None, *, tree: bool = False) -> Sample:
    """Samples the resident memory of one process, or of it and all its descendants.

    Example:
        >>> sample().rss > 0
        True

    Args:
        pid: the process; defaults to this one.
        tree: sum over the process and all its descendants (children that exit while
            being read are skipped, and so is a child that still runs in its parent's
            memory, see :func:`shares_memory`).

    Raises:
        ProcessLookupError: if ``pid`` does not exist.
    """
    pid = os.getpid() if pid is None else pid
    try:
        root = _one(pid)
    except (psutil.NoSuchProcess, FileNotFoundError) as e:
        raise ProcessLookupError(f"No process with pid={pid} to sample.") from e
    if not tree:
        return root
    total = dataclasses.replace(root, rss_peak=None)   # a tree has no single high-water mark
    for child in descendants(pid):
        status = _read_status(child)
        if status is None:          # exited, a zombie, or not readable: holds no memory we see
            continue
        if "ppid" in status and shares_memory(status["ppid"], child):
            continue                # a vfork child before its exec: its parent's memory
        total = Sample(t=total.t, pid=pid, rss=total.rss + status["rss"],
                       rss_anon=_add(total.rss_anon, status.get("rss_anon")),
                       rss_file=_add(total.rss_file, status.get("rss_file")),
                       rss_shmem=_add(total.rss_shmem, status.get("rss_shmem")),
                       rss_peak=None, processes=total.processes + 1)
    return total


@dataclasses.dataclass
class Measurement:
    """What :func:`measure` saw: the sample before the block, after it, and the peak.

    ``peak`` holds, field by field, the largest value seen by the sampler thread (and the
    kernel's high-water mark for total RSS where available), so a short spike between two
    samples still shows in ``peak.rss``.
    """

    before: Sample
    after: Sample | None = None
    peak: Sample | None = None
    samples: int = 0

    @property
    def peak_delta(self) -> int:
        """Peak anonymous (else total) RSS above the value before the block, in bytes."""
        assert self.peak is not None, "the block has not ended yet"
        return self.peak.anon_or_total - self.before.anon_or_total

    def __str__(self) -> str:
        if self.after is None or self.peak is None:
            return f"Measurement(before={format_size(self.before.rss)}, running)"
        lines = ["            total      anon       file"]
        for label, s in (("before", self.before), ("after", self.after), ("peak", self.peak)):
            lines.append(f"{label:<7} {format_size(s.rss):>10} {format_size(s.rss_anon):>10} "
                         f"{format_size(s.rss_file):>10}")
        return "\n".join(lines)


def _reset_peak(pid: int) -> bool:
    # Writing 5 to clear_refs resets VmHWM (Linux >= 4.0); only allowed for our own tree.
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


_PEAK_FIELDS = ("rss", "rss_anon", "rss_file", "rss_shmem", "rss_peak", "processes")


def peak_of(a: Sample | None, b: Sample) -> Sample:
    """The field-wise maximum of two samples (a running peak: ``peak = peak_of(peak, s)``).

    A field absent from one sample takes the other's value; ``t`` and ``pid`` are ``b``'s.

    Example:
        >>> s = sample()
        >>> peak_of(None, s) is s
        True
    """
    if a is None:
        return b
    return dataclasses.replace(b, **{k: _max(getattr(a, k), getattr(b, k))
                                     for k in _PEAK_FIELDS})


@contextlib.contextmanager
def measure(pid: int | None = None, *, interval: float = 0.01,
            tree: bool = False) -> Iterator[Measurement]:
    """Measures resident memory before, after, and at the peak of a block.

    A background thread samples every ``interval`` seconds; for this process the kernel's
    high-water mark is reset at the start so that the total-RSS peak is exact.

    Example:
        >>> import numpy as np
        >>> with measure() as m:
        ...     a = np.ones(2**24)          # 128 MiB of anonymous memory
        >>> print(m)                        # doctest: +SKIP
                    total      anon       file
        before   210.3 MiB  120.1 MiB   90.2 MiB
        ...

    Args:
        pid: the process to watch; defaults to this one.
        interval: seconds between samples of the background thread.
        tree: include the descendants of the process.
    """
    interval = checks.seconds("interval", interval)
    pid = os.getpid() if pid is None else pid
    exact_peak = not tree and _reset_peak(pid)
    before = sample(pid, tree=tree)
    result = Measurement(before=before)
    peak = before
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.wait(interval):
            try:
                s = sample(pid, tree=tree)
            except ProcessLookupError:
                return
            peak = peak_of(peak, s)
            result.samples += 1

    thread = threading.Thread(target=watch, name="memfit-measure", daemon=True)
    thread.start()
    try:
        yield result
    finally:
        stop.set()
        thread.join()
        after = sample(pid, tree=tree)
        top = peak_of(peak, after)
        if exact_peak and after.rss_peak is not None:   # the kernel saw every spike
            top = dataclasses.replace(top, rss=max(top.rss, after.rss_peak))
        result.after = after
        result.peak = dataclasses.replace(top, rss_peak=None)


# -- optional sources: each returns None when it is not available (absent, never zero) --

def python_heap() -> dict[str, int] | None:
    """Python heap current/peak from ``tracemalloc``, if it is tracing (it is costly, so
    memfit only reads it when asked; start it with ``tracemalloc.start()``)."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return None
    current, peak = tracemalloc.get_traced_memory()
    return {"current": current, "peak": peak}


def tf_gpu_memory() -> dict[str, dict[str, int]] | None:
    """TensorFlow's allocator current/peak per GPU (``get_memory_info``); ``None`` without
    TensorFlow imported or without a GPU. Never imports TensorFlow itself."""
    import sys

    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    try:
        gpus = tf.config.list_logical_devices("GPU")
    except Exception:                                  # TF not initialised for devices yet
        return None
    out = {}
    for device in gpus:
        name = device.name.split("device:")[-1]
        try:
            info = tf.config.experimental.get_memory_info(name)
        except (ValueError, RuntimeError):
            continue
        out[name] = {"current": int(info["current"]), "peak": int(info["peak"])}
    return out or None


def device_stats(devices: list) -> dict[str, dict[str, int]] | None:
    """The allocator statistics of JAX devices (``device.memory_stats()``), in the
    record's ``gpu`` form: ``{"GPU:0": {"current", "peak", "limit"}}`` (bytes in use,
    the peak, the allocator's limit), ``None`` when no device keeps any (the CPU's
    ``memory_stats()`` returns ``None``).

    Example:
        >>> class Device:
        ...     platform, id = "gpu", 0
        ...     def memory_stats(self):
        ...         return {"bytes_in_use": 5, "peak_bytes_in_use": 9, "bytes_limit": 16}
        >>> device_stats([Device()])
        {'GPU:0': {'current': 5, 'peak': 9, 'limit': 16}}

    Args:
        devices: JAX devices (``jax.local_devices()``).
    """
    out = {}
    for device in devices:
        try:
            stats = device.memory_stats()
        except Exception:                              # a backend without statistics
            stats = None
        if not stats or "bytes_in_use" not in stats:
            continue
        entry = {"current": int(stats["bytes_in_use"]),
                 "peak": int(stats.get("peak_bytes_in_use", stats["bytes_in_use"]))}
        if stats.get("bytes_limit"):
            entry["limit"] = int(stats["bytes_limit"])
        out[f"{str(device.platform).upper()}:{device.id}"] = entry
    return out or None


def jax_device_memory() -> dict[str, dict[str, int]] | None:
    """JAX's allocator statistics per local device (:func:`device_stats`); ``None``
    without JAX imported, before JAX started its backend (reading them would start it,
    and settle its platform and flags too early), or on the CPU. Never imports JAX."""
    import sys

    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        from jax._src import xla_bridge

        if not xla_bridge.backends_are_initialized():
            return None
        return device_stats(jax.local_devices())
    except Exception:                                  # another JAX: no statistics
        return None


_nvml_state: dict = {}


def nvml_devices(pid: int | None = None) -> list[dict] | None:
    """Every GPU as NVML sees it, or ``None`` where NVML (the ``nvidia-ml-py`` package
    or a driver) is not available.

    Returns:
        ``[{"index", "name", "total", "used", "free", "own", "others": [{"pid",
        "used"}]}]``, sizes in bytes: ``own`` is what the driver charges to ``pid``
        (default this process) on that device, ``None`` when it is not listed there;
        ``others`` are the other processes on it.
    """
    pid = os.getpid() if pid is None else pid
    if _nvml_state.get("failed"):
        return None
    try:
        import pynvml

        if not _nvml_state.get("init"):
            pynvml.nvmlInit()
            _nvml_state["init"] = True
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            own, others = None, []
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = int(proc.usedGpuMemory or 0)
                if proc.pid == pid:
                    own = (own or 0) + used
                else:
                    others.append({"pid": int(proc.pid), "used": used})
            name = pynvml.nvmlDeviceGetName(handle)
            devices.append({"index": index, "name": name.decode() if isinstance(name, bytes)
                            else str(name), "total": int(info.total), "used": int(info.used),
                            "free": int(info.free), "own": own, "others": others})
        return devices
    except Exception:                                  # no package, no driver, no GPU
        _nvml_state["failed"] = True
        return None


def nvml_memory(pid: int | None = None, *, tree: bool = False) -> int | None:
    """GPU memory that the NVIDIA driver charges to ``pid`` (all GPUs), from NVML, or to
    it and its descendants with ``tree``; ``None`` where NVML is not available or none of
    them uses a GPU."""
    pid = os.getpid() if pid is None else pid
    owned = [d["own"] for p in [pid, *(descendants(pid) if tree else [])]
             for d in nvml_devices(p) or [] if d["own"] is not None]
    return sum(owned) if owned else None


def extended_record(pid: int | None = None, *, python: bool = False) -> dict:
    """A log record of :func:`sample` plus whatever optional sources are available."""
    record = sample(pid).as_record()
    heap = python_heap() if python else None
    own = pid in (None, os.getpid())
    gpu = (tf_gpu_memory() or jax_device_memory()) if own else None
    nvml = nvml_memory(pid) if gpu else None
    for key, value in (("py_heap", heap), ("gpu", gpu), ("nvml", nvml)):
        if value is not None:
            record[key] = value
    return record
