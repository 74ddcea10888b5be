"""How one planned job is started: its command, its environment, its files.

``memfit share`` starts every job through these three functions, and anything else that
starts a :class:`~memfit.share.planner.PlannedJob` (on this machine or another) should
too, so that a job runs the same wherever it runs:

- :func:`job_command`: the job's own command; a supervised job (``restart``) runs it
  under ``python -m memfit run`` with the job's directory as its workdir and, on the
  CPU, ``--max-rss`` at :data:`REQUEST_AT` (90 %) and ``--hard-rss`` at 100 % of its
  share less :data:`~memfit.share.planner.SUPERVISOR_RSS` (``memfit run``'s own memory,
  which the share includes), and always ``--start cold``: a warm parent
  (:mod:`memfit.supervise.warm`) holds a few hundred MiB of its own that the share would
  have to charge, and its forked trainings count pages it shares with them;
- :func:`job_environment`: the variables added to the environment: ``$MEMFIT_WORKDIR``
  (the job's directory), ``$MEMFIT_SHARE_JOB`` (its name) and ``$MEMFIT_SHARE`` (its
  share in bytes); on the CPU ``CUDA_VISIBLE_DEVICES=-1`` (the budget is host memory);
  on ``gpu:N`` ``CUDA_VISIBLE_DEVICES=N`` and, for ``memfit.configure_device()`` in the
  job, the cap at its need (or memory growth when its need is unknown and it runs alone
  to learn it), and JAX's own variables (no preallocation; the need's share of the card
  as ``XLA_PYTHON_CLIENT_MEM_FRACTION``) (:func:`memfit.device.device_env`); then the
  jobs file's ``env``, which wins;
- :func:`start_job`: makes the job's directory (:class:`~memfit.share.layout.JobFiles`,
  ``WORKDIR/jobs/NAME``) and starts the command with its standard output and error going
  to ``stdout.log`` and ``stderr.log`` there.

Example:
    >>> from memfit.share.planner import PlannedJob
    >>> job = PlannedJob(name="a", command=("python", "train.py"), need=2**30,
    ...                  need_source="given", note="given", charge=2**30 + 2**28,
    ...                  exclusive=False, restart=False, env={}, index=1)
    >>> files = JobFiles.of("runs/share", "a")
    >>> job_command(job, "cpu", files)
    ['python', 'train.py']
    >>> from memfit.env import GPU_MEMORY_LIMIT_ENV
    >>> env = job_environment(job, "gpu:1", files)
    >>> env[CUDA_DEVICES_ENV], env[GPU_MEMORY_LIMIT_ENV], env[SHARE_JOB_ENV]
    ('1', '1073741824', 'a')
"""

from __future__ import annotations

import subprocess
import sys

from memfit import checks
from memfit.device import device_env
from memfit.env import SHARE_ENV, SHARE_JOB_ENV, WORKDIR_ENV
from memfit.memory.process import start
from memfit.share.layout import JobFiles
from memfit.share.planner import SUPERVISOR_RSS, PlannedJob, gpu_memory

__all__ = ["job_command", "job_environment", "start_job", "REQUEST_AT", "CUDA_DEVICES_ENV"]

REQUEST_AT = 0.9                    # a supervised job is asked to checkpoint at 90 % of share
CUDA_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


def job_command(job: PlannedJob, device: str, files: JobFiles, *,
                interval: float = 0.5) -> list[str]:
    """The command that runs ``job``: its own, or under ``python -m memfit run`` when it
    is supervised.

    Args:
        job: the planned job.
        device: the plan's device, ``"cpu"`` or ``"gpu:N"``.
        files: the job's files (a supervised job's ``memfit run`` keeps its log and
            checkpoints in their directory).
        interval: seconds between ``memfit run``'s samples of the training process.
    """
    if not job.restart:
        return list(job.command)
    interval = checks.seconds("interval", interval)
    command = [sys.executable, "-m", "memfit", "run", "--workdir", str(files.directory),
               "--interval", f"{interval:g}", "--start", "cold"]
    if device == "cpu":
        limit = job.charge - SUPERVISOR_RSS      # the training process's own tree
        command += ["--max-rss", str(int(limit * REQUEST_AT)), "--hard-rss", str(limit)]
    return command + ["--", *job.command]


def job_environment(job: PlannedJob, device: str, files: JobFiles) -> dict[str, str]:
    """The variables added to the job's environment (the rest is inherited).

    Args:
        job: the planned job.
        device: the plan's device, ``"cpu"`` or ``"gpu:N"``.
        files: the job's files (their directory is the job's ``$MEMFIT_WORKDIR``).
    """
    env = {WORKDIR_ENV: str(files.directory.resolve()), SHARE_JOB_ENV: job.name,
           SHARE_ENV: str(job.charge)}
    if device == "cpu":
        env[CUDA_DEVICES_ENV] = "-1"             # the budget is host memory: keep off GPUs
    else:
        env[CUDA_DEVICES_ENV] = device.split(":", 1)[1]
        # A job of known need is capped at it; one run alone to learn it grows as needed
        # (so that its peak means something).
        card = gpu_memory(int(env[CUDA_DEVICES_ENV]))
        env.update(device_env(memory_limit=job.need, card_total=card[0] if card else None)
                   if job.need is not None else device_env(growth=True))
    env.update(job.env)
    return env


def start_job(job: PlannedJob, device: str, files: JobFiles, *,
              interval: float = 0.5) -> subprocess.Popen:
    """Starts ``job``: makes its directory and runs :func:`job_command` with
    :func:`job_environment` added to this process's, its output going to its files.

    Args:
        job: the planned job.
        device: the plan's device, ``"cpu"`` or ``"gpu:N"``.
        files: where its directory is (created if missing).
        interval: seconds between ``memfit run``'s samples (a supervised job).

    Returns:
        The started process (for a supervised job, ``memfit run``).

    Raises:
        CommandStartError: its program does not exist (127) or cannot be run (126).
    """
    files.create()
    command = job_command(job, device, files, interval=interval)
    with open(files.stdout, "wb") as out, open(files.stderr, "wb") as err:
        return start(command, job_environment(job, device, files), stdout=out, stderr=err)
