"""TensorFlow's and JAX's start-up chatter, kept off the user's screen (``--verbose`` shows it).

Every process that imports TensorFlow 2.21 prints, on a machine without a GPU::

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:… port.cc:153] oneDNN custom operations are on. You may see slightly …
    I0000 00:00:… cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU …
    E0000 00:00:… cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: …

What silences what (measured with ``python -c "import tensorflow"``):

- The first three (twice: two of TensorFlow's libraries log them) are written by absl
  while the libraries load, before logging is initialised: no environment variable
  silences them. ``TF_CPP_MIN_LOG_LEVEL=3`` does not; ``TF_ENABLE_ONEDNN_OPTS=0`` drops
  the oneDNN line only by changing the numerics, which memfit never does.
- ``failed call to cuInit`` is logged at error level on the first device query:
  ``TF_CPP_MIN_LOG_LEVEL=3`` hides it, and every other error TensorFlow logs with it.
- ``This TensorFlow binary is optimized…`` / ``To enable the following instructions…``
  and the graph optimizer's ``Number of eligible GPUs…`` / ``Starting new session`` are
  info lines: ``TF_CPP_MIN_LOG_LEVEL=1`` hides them. TensorFlow reads the variable once,
  while it is imported.

TensorFlow's TFRecord reader logs an info line the first time a process opens a TFRecord
file, whatever ``buffer_size`` is given (none: ``TFRecordDataset `buffer_size` is
unspecified, default to 262144``; one, even that: ``The default buffer size is 262144,
which is overridden by the user specified `buffer_size` of 262144``), and never again. It
is logged in a ``tf.data`` thread once the pipeline runs (under ``model.fit``), where
nothing can hold fd 2, so :func:`spend_tfrecord_reader_line` has it logged earlier, while
fd 2 is held, by reading an empty file.

JAX logs its own when it starts its backend, through Python's ``logging`` (bare, as
``INFO:jax._src.xla_bridge:…``, or in absl's format when TensorFlow is imported too)::

    Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so: …
    An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not …

So memfit removes these lines by what they say, and leaves everything else (the user's
output, TensorFlow's warnings and errors) as it is:

- in the processes memfit starts (:func:`memfit.memory.process.start`, for ``memfit run``,
  ``share`` and ``doctor``), while :func:`quieted` is on: their stderr passes through
  :class:`LineFilter` on its way to the terminal (or the job's log file). Their
  environment is not changed; ``memfit watch`` does not turn it on (it runs the command
  unchanged);
- in memfit's own process (``memfit estimate``...): :func:`quieted` holds file
  descriptor 2 while TensorFlow is imported and its devices are listed, then passes on
  all but these lines; and, when ``TF_CPP_MIN_LOG_LEVEL`` is not set, it is 1 while
  TensorFlow reads it (hiding the info lines of the estimate's graph optimizer), and unset
  again after, so no child inherits it. A value the user set is left alone. JAX's lines
  are dropped from its logger by a :class:`logging.Filter` while :func:`quieted` is on.
- in memfit's own process, before a pipeline that reads TFRecord files with TensorFlow's
  reader: :func:`spend_tfrecord_reader_line` (once a process).
- in the user's process, where ``memfit.dataset`` is the first to import TensorFlow (a
  JAX user's images kept encoded, which only ``tf.data`` decodes): :func:`import_tensorflow`
  imports it under :func:`quieted`. Where the user imported it first, nothing changes.
- estimate's measuring children write to files that memfit reads; :func:`strip_noise`
  takes the lines out of what a failed child's message quotes.

Keras warns "`shuffle=True` was passed, but will be ignored since the data `x` was
provided as a tf.data.Dataset" on every ``fit`` of a dataset. A ``memfit.dataset`` is
shuffled by construction (its order is a function of the seed and the epoch), so
:func:`ignore_keras_shuffle_warning` filters that one message, in a process that built a
memfit dataset.

Example:
    >>> is_noise("I0000 00:00:1796135741.715347   22348 cudart_stub.cc:31] Could not "
    ...          "find cuda drivers on your machine, GPU will not be used.")
    True
    >>> strip_noise("Epoch 1/3\\nWARNING: All log messages before absl::InitializeLog() "
    ...             "is called are written to STDERR\\nloss 0.1\\n")
    'Epoch 1/3\\nloss 0.1\\n'
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import logging
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["NOISE", "is_noise", "strip_noise", "LineFilter", "FilteredPopen", "quieted",
           "import_tensorflow", "filtered_stderr", "filters_children",
           "ignore_keras_shuffle_warning", "spend_tfrecord_reader_line", "LOG_LEVEL_ENV"]

LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"

# The prefix absl/TensorFlow put before a C++ log line: "I0000 00:00:1796….561436   21952
# port.cc:153] " (TF >= 2.17) or "2025-09-17 14:44:05.157831: I external/…/cudart_stub.cc:32] ".
_PREFIX = (r"(?:[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ |"
           r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] )(?:\S*/)?")

_JAX_LOGGER = "jax._src.xla_bridge"
_JAX_PREFIX = (r"(?:" + _PREFIX + r"xla_bridge\.py:\d+\] |(?:INFO|WARNING):"
               + re.escape(_JAX_LOGGER) + r":)?")

#: The start-up lines memfit removes, each matched against one whole line.
NOISE = tuple(re.compile(p) for p in (
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR$",
    _PREFIX + r"port\.cc:\d+\] oneDNN custom operations are on\. ",
    _PREFIX + r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will "
              r"not be used\.$",
    _PREFIX + r"\S+\.cc:\d+\] failed call to cuInit: ",
    _PREFIX + r"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use "
              r"available CPU instructions",
    r"To enable the following instructions: [A-Z0-9_ ]+, in other operations, rebuild "
    r"TensorFlow with the appropriate compiler flags\.$",
    _PREFIX + r"\S+\.cc:\d+\] Unable to register cu(?:DNN|FFT|BLAS) factory: Attempting to "
              r"register factory for plugin cu(?:DNN|FFT|BLAS) when one has already been "
              r"registered$",
    _PREFIX + r"\S+\.cc:\d+\] computation placer already registered\. ",
    _PREFIX + r"devices\.cc:\d+\] Number of eligible GPUs \(core count >= \d+, compute "
              r"capability >= [\d.]+\): \d+$",
    _PREFIX + r"single_machine\.cc:\d+\] Starting new session$",
    # The TFRecord reader, the first time a process opens a file (either line).
    _PREFIX + r"tf_record_dataset_op\.cc:\d+\] TFRecordDataset `buffer_size` is unspecified, "
              r"default to \d+$",
    _PREFIX + r"tf_record_dataset_op\.cc:\d+\] The default buffer size is \d+, which is "
              r"overridden by the user specified `buffer_size` of -?\d+$",
    # JAX, when it starts its backend (Python logging: bare, in logging's default format,
    # or in absl's when TensorFlow or absl set it up).
    _JAX_PREFIX + r"Unable to initialize backend 'tpu': ",
    _JAX_PREFIX + r"An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib "
                  r"is not installed\. Falling back to \w+\.$",
    _JAX_PREFIX + r"A Google TPU may be present on this machine, but either a TPU-enabled "
                  r"jaxlib or libtpu is not installed\. Falling back to \w+\.$",
))

# The start of a line is held back until its end arrives, up to this many bytes, or
# HOLD_SECONDS without more (LineFilter).
_HOLD_BYTES = 8192
HOLD_SECONDS = 0.2
_DRAIN_SECONDS = 1.0        # how long wait() waits for the filter to pass on the last lines



@dataclasses.dataclass
class _Switches:
    """What :func:`quieted` has turned on in this process (one instance, module-wide)."""

    children: bool = False      # filter the stderr of the children memfit starts
    shown: bool = False         # inside quieted(False) (--verbose): filter nothing


_switches = _Switches()


def is_noise(line: str) -> bool:
    """Whether ``line`` (without its newline) is one of TensorFlow's start-up lines.

    Args:
        line: one line of a process's stderr.
    """
    line = line.rstrip("\r\n")
    return any(p.match(line) for p in NOISE)


def strip_noise(text: str) -> str:
    """``text`` without TensorFlow's start-up lines (:data:`NOISE`).

    Args:
        text: what a process wrote to stderr.
    """
    return "".join(line for line in text.splitlines(keepends=True) if not is_noise(line))


class LineFilter:
    """Takes TensorFlow's start-up lines out of a byte stream, as it arrives.

    Whole lines are passed on or dropped; the start of a progress bar's line (a ``\\r`` or
    ``\\b`` in it) is passed on at once, the start of any other line is held until its
    end arrives or :meth:`flush` is called (the filter's thread flushes it after
    :data:`HOLD_SECONDS` without more).

    Example:
        >>> f = LineFilter()
        >>> f.feed(b"step 1\\nWARNING: All log messages before absl::InitializeLog() is ")
        b'step 1\\n'
        >>> f.feed(b"called are written to STDERR\\n\\r10%|#")
        b'\\r10%|#'
    """

    def __init__(self) -> None:
        self._held = b""
        self._passing = False       # in a line whose start was passed on already

    @property
    def pending(self) -> bool:
        """Whether the start of a line is held back."""
        return bool(self._held)

    def feed(self, data: bytes) -> bytes:
        """What to pass on of ``data`` (and of what was held before it).

        Args:
            data: the next bytes of the stream.
        """
        out = []
        data, self._held = self._held + data, b""
        while data:
            end = data.find(b"\n")
            if end < 0:
                # A progress bar ('\r') goes on at once; any other start of a line waits for
                # its end (or HOLD_SECONDS): it may be noise, and a line written in two parts
                # ("text", then "\n") came out with the other stream's line spliced in (a
                # stranger's "memfit: resuming ... (seed 7)Epoch 2/20" under memfit run).
                if self._passing or len(data) > _HOLD_BYTES or b"\r" in data or b"\b" in data:
                    out.append(data)
                    self._passing = True
                else:
                    self._held = data
                break
            line, data = data[:end + 1], data[end + 1:]
            if self._passing or not is_noise(line.decode("utf-8", "replace")):
                out.append(line)
            self._passing = False
        return b"".join(out)

    def flush(self) -> bytes:
        """The held start of a line, passed on as it is (the stream paused or ended)."""
        out, self._held = self._held, b""
        if out:
            self._passing = True
        return out


def _write_all(fd: int, data: bytes) -> bool:
    """Writes ``data`` to ``fd``; ``False`` once the reader is gone (then keep draining)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError:
            return False
    return True


def _pump(read_fd: int, write_fd: int) -> None:
    """Passes a child's stderr on to ``write_fd`` through a :class:`LineFilter`, until the
    last writer closes it. It always drains the pipe, so the child never blocks on it."""
    f = LineFilter()
    alive = True
    try:
        while True:
            ready, _, _ = select.select([read_fd], [], [], HOLD_SECONDS if f.pending else None)
            if not ready:
                alive = alive and _write_all(write_fd, f.flush())
                continue
            try:
                data = os.read(read_fd, 65536)
            except InterruptedError:
                continue
            if not data:
                break
            passed = f.feed(data)
            if alive and passed:
                alive = _write_all(write_fd, passed)
        if alive:
            _write_all(write_fd, f.flush())
    finally:
        os.close(read_fd)
        os.close(write_fd)


class FilteredPopen(subprocess.Popen):
    """A :class:`subprocess.Popen` whose stderr reaches ``stderr`` (default: this
    process's) through a :class:`LineFilter`; ``wait()`` and ``poll()`` return once its
    last lines are passed on, so what memfit prints after a child's end comes after them.

    Example:
        >>> p = FilteredPopen([sys.executable, "-c", "pass"])
        >>> p.wait()
        0

    Args:
        args: the command.
        stderr: an open file (its descriptor is duplicated: the caller may close it once
            the process started), or ``None`` for this process's standard error.
        **kwargs: the other arguments of :class:`subprocess.Popen`.
    """

    _filter: threading.Thread | None = None
    _waited = True              # until the filter runs: nothing to wait for

    def __init__(self, args: Sequence[str], *, stderr: Any = None, **kwargs: Any):
        target = os.dup(2 if stderr is None else stderr.fileno())
        read_fd, write_fd = os.pipe()
        try:
            super().__init__(args, stderr=write_fd, **kwargs)
        except BaseException:
            for fd in (target, read_fd):
                os.close(fd)
            raise
        finally:
            os.close(write_fd)
        self._filter = threading.Thread(target=_pump, args=(read_fd, target), daemon=True,
                                        name=f"memfit-stderr-{self.pid}")
        self._filter.start()
        self._waited = False

    def _drained(self) -> None:
        # A grandchild that outlives the child may hold the pipe open: wait for the filter
        # once, and not long.
        if not self._waited and self._filter is not None:
            self._waited = True
            self._filter.join(timeout=_DRAIN_SECONDS)

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._drained()
        return code

    def poll(self) -> int | None:
        code = super().poll()
        if code is not None:
            self._drained()
        return code


class _JaxStartupFilter(logging.Filter):
    """Drops JAX's start-up records (:data:`NOISE`) from its backend's logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not is_noise(record.getMessage())
        except Exception:                           # a record that cannot format
            return True


def filters_children() -> bool:
    """Whether the children memfit starts now have TensorFlow's start-up lines filtered
    (inside :func:`quieted`)."""
    return _switches.children


class _QuietImport(importlib.abc.MetaPathFinder):
    """Imports ``tensorflow`` (the first time anything does) with fd 2 held."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        _uninstall(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader: Any):
        self._loader = loader

    def __getattr__(self, name: str) -> Any:        # get_data, get_resource_reader...
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        with filtered_stderr(), _log_level():
            self._loader.exec_module(module)
            # The first device query logs cuInit's error on a machine without a GPU: here,
            # while held. Listing physical devices leaves them configurable.
            with contextlib.suppress(Exception):
                module.config.list_physical_devices()


def _uninstall(finder: _QuietImport) -> None:
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(finder)


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Points fd 2 at a temporary file; at the end, writes back all but TensorFlow's
    start-up lines (:func:`is_noise`), in order: for a block of this process that makes
    TensorFlow log them (a first device query, the graph optimizer's session).

    Example:
        >>> with filtered_stderr():                              # doctest: +SKIP
        ...     tf_optimizer.OptimizeGraph(config, meta_graph)   # no "Starting new session"

    Inside ``quieted(False)`` (``--verbose``) it changes nothing.
    """
    if _switches.shown:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                held.seek(0)
                kept = strip_noise(held.read().decode("utf-8", "replace"))
                if kept:
                    _write_all(2, kept.encode("utf-8"))
    finally:
        os.close(saved)


@contextlib.contextmanager
def _log_level() -> Iterator[None]:
    """``TF_CPP_MIN_LOG_LEVEL=1`` while TensorFlow reads it, unless the user set it."""
    if LOG_LEVEL_ENV in os.environ:
        yield
        return
    os.environ[LOG_LEVEL_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(LOG_LEVEL_ENV, None)


@contextlib.contextmanager
def quieted(enabled: bool = True) -> Iterator[None]:
    """TensorFlow's start-up lines off the screen while the block runs: in this process's
    own import of TensorFlow (if it happens in the block) and in the stderr of the
    children :func:`memfit.memory.process.start` starts. ``enabled=False`` (``--verbose``)
    changes nothing, and turns off the quieting nested in it (a library call inside a
    command run with ``--verbose`` shows TensorFlow's lines too).

    Example:
        >>> with quieted():                                      # doctest: +SKIP
        ...     import tensorflow                                # no start-up lines

    Args:
        enabled: whether to filter.
    """
    if not enabled or _switches.shown:
        previous, _switches.shown = _switches.shown, _switches.shown or not enabled
        try:
            yield
        finally:
            _switches.shown = previous
        return
    finder = None
    if "tensorflow" not in sys.modules:
        finder = _QuietImport()
        sys.meta_path.insert(0, finder)
    previous, _switches.children = _switches.children, True
    jax_filter = _JaxStartupFilter()
    logging.getLogger(_JAX_LOGGER).addFilter(jax_filter)
    try:
        yield
    finally:
        _switches.children = previous
        logging.getLogger(_JAX_LOGGER).removeFilter(jax_filter)
        if finder is not None:
            _uninstall(finder)


def import_tensorflow() -> None:
    """Imports TensorFlow under :func:`quieted` where memfit is the first to import it in
    this process: ``memfit.dataset`` on a JAX user's images kept encoded (only ``tf.data``
    decodes them), or before the user imports Keras. Its start-up lines are then memfit's
    doing, and are dropped; where TensorFlow is imported already, the user's own import
    showed what it shows, and nothing changes. Inside ``quieted(False)`` they are shown."""
    if "tensorflow" in sys.modules:
        return
    with quieted():
        import tensorflow  # noqa: F401


_spent_lock = threading.Lock()
_spent: set[str] = set()


def spend_tfrecord_reader_line() -> None:
    """Has TensorFlow log its TFRecord reader's info line now, while fd 2 is held
    (:func:`filtered_stderr` drops it), by reading an empty TFRecord file: it logs that line
    the first time a process opens a TFRecord file, and never again. Call it, once
    TensorFlow is imported, before building a pipeline that reads TFRecord files with
    ``tf.data.TFRecordDataset``, which would otherwise log it in a ``tf.data`` thread while
    the model trains (without a ``buffer_size``: memfit names none). Once a process; inside
    ``quieted(False)`` (``--verbose``) the line is shown."""
    with _spent_lock:
        if "tfrecord" in _spent:
            return
        _spent.add("tfrecord")
        import tensorflow as tf

        with tempfile.TemporaryDirectory(prefix="memfit-") as d:
            empty = os.path.join(d, "empty.tfrecords")
            open(empty, "wb").close()
            with filtered_stderr():
                for _ in tf.data.TFRecordDataset(empty):
                    pass


_SHUFFLE_WARNING = ("`shuffle=True` was passed, but will be ignored since the data `x` was "
                    "provided as a tf.data.Dataset")


def ignore_keras_shuffle_warning() -> None:
    """Filters Keras's "`shuffle=True` was passed, but will be ignored…" warning for
    ``tf.data.Dataset`` inputs (that message only, raised from Keras): ``fit`` passes
    ``shuffle=True`` by default, and a ``memfit.dataset`` is shuffled already."""
    warnings.filterwarnings("ignore", message=re.escape(_SHUFFLE_WARNING),
                            category=UserWarning, module=r"keras\.")
