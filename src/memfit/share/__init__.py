"""Run several trainings on one device within a memory budget: ``memfit share``.

    memfit.share(jobs, budget=...)      run the jobs, packed on the budget (ShareResult)
    plan(jobs, budget=...)              what would run, every need resolved; starts nothing
    load_jobs(path)                     read and check a jobs file (TOML)
    configure_device(memory_limit=...)  in a job: the GPU cap memfit share handed down

Each job is charged its need plus the per-process overhead of the device (measured by
``memfit calibrate``), jobs are packed first-fit decreasing, and each is held to its
share by watching its process tree with the one probe (on a GPU: the cap and NVML).
Importing this package does not import TensorFlow.

Example:
    >>> import memfit
    >>> result = memfit.share("examples/jobs.toml", budget="1GiB")    # doctest: +SKIP
    >>> print(result)                                                 # doctest: +SKIP
"""

from memfit.device import DeviceConfig, DeviceConfigError, configure_device
from memfit.share.jobs import Job, JobsFileError, JobsSpec, load_jobs, parse_jobs
from memfit.share.planner import Plan, PlannedJob, pick, plan
from memfit.share.results import JobResult, ShareResult
from memfit.share.runner import share

__all__ = ["DeviceConfig", "DeviceConfigError", "Job", "JobResult", "JobsFileError",
           "JobsSpec", "Plan", "PlannedJob", "ShareResult", "configure_device", "load_jobs",
           "parse_jobs", "pick", "plan", "share"]

