"""Run several trainings on one device within a memory budget: ``memfit share``.

    memfit.share_jobs(jobs, budget=...) run the jobs, packed on the budget (ShareResult)
    plan(jobs, budget=...)              what would run, every need resolved; starts nothing
    load_jobs(path)                     read and check a jobs file (TOML)
    configure_device(memory_limit=...)  in a job: the GPU cap memfit share handed down

Each job is charged its need plus the per-process overhead of the device (measured by
``memfit calibrate``), jobs are packed first-fit decreasing, and each is held to its
share by watching its process tree with the one probe (on a GPU: the cap and NVML).
Importing this package does not import TensorFlow. Calling it as ``memfit.share_jobs(...)``
still runs :func:`memfit.share_jobs` for this release, with a DeprecationWarning.

Example:
    >>> import memfit
    >>> result = memfit.share_jobs("examples/jobs.toml", budget="1GiB")    # doctest: +SKIP
    >>> print(result)                                                 # doctest: +SKIP
"""

from memfit.callable_package import make_callable
from memfit.device import DeviceConfig, DeviceConfigError, configure_device
from memfit.share.jobs import Job, JobsFileError, JobsSpec, load_jobs, parse_jobs
from memfit.share.planner import Plan, PlannedJob, pick, plan
from memfit.share.runner import share
from memfit.share.share_results import JobResult, ShareResult

__all__ = ["DeviceConfig", "DeviceConfigError", "Job", "JobResult", "JobsFileError",
           "JobsSpec", "Plan", "PlannedJob", "ShareResult", "configure_device", "load_jobs",
           "parse_jobs", "pick", "plan", "share"]

# memfit.share(...) runs the function for one more release, with a DeprecationWarning
make_callable(__name__, "memfit.share.runner:share", "share_jobs")
