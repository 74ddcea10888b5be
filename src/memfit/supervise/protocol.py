"""How ``memfit run`` (the parent) and ``memfit.session()`` (in the child) talk.

The parent starts the training command with these environment variables:

    MEMFIT_WORKDIR          the run's workdir (shared log, checkpoints/)
    MEMFIT_SUPERVISOR       the parent's pid: the child may exit to be restarted
    MEMFIT_RESTART_EVERY    restart after this many epochs in one process (unset: never)
    MEMFIT_MAX_RSS          the parent's --max-rss in bytes (the child checks its baseline)

To ask for a graceful restart, the parent writes the file ``WORKDIR/restart.request``
(one JSON object: ``reason``, ``rss``). The child's session checks for it after every
training step; on seeing it, it finishes the step, checkpoints and exits with
``memfit.exitcodes.RESTART`` (75). A user may do the same by hand:
``echo '{"reason": "manual"}' > WORKDIR/restart.request``. Exit codes are in
:mod:`memfit.exitcodes`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from memfit.atomic import write_text_atomic
from memfit.env import MAX_RSS_ENV, RESTART_EVERY_ENV, SUPERVISOR_ENV

__all__ = ["DEFAULT_WORKDIR", "SUPERVISOR_ENV", "RESTART_EVERY_ENV", "MAX_RSS_ENV", "REQUEST_NAME",
           "write_request", "read_request", "clear_request"]

DEFAULT_WORKDIR = "memfit-run"      # of `memfit run` and a session not given one
REQUEST_NAME = "restart.request"


def write_request(workdir: str | os.PathLike, reason: str, **fields: object) -> Path:
    """Asks the session in ``workdir`` to checkpoint and exit for a restart."""
    path = Path(workdir) / REQUEST_NAME
    write_text_atomic(path, json.dumps({"reason": reason, **fields}))
    return path


def read_request(workdir: str | os.PathLike) -> dict | None:
    """The pending request in ``workdir``, or ``None`` (an unreadable one counts as
    ``{"reason": "request"}``: it was written by hand)."""
    path = Path(workdir) / REQUEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return None
    try:
        request = json.loads(text)
    except json.JSONDecodeError:
        request = None
    return request if isinstance(request, dict) and "reason" in request \
        else {"reason": "request"}


def clear_request(workdir: str | os.PathLike) -> None:
    """Removes a pending request (the parent does, before it starts a child)."""
    (Path(workdir) / REQUEST_NAME).unlink(missing_ok=True)
