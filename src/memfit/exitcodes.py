"""Exit codes that memfit's processes use to talk to each other.

``RESTART`` (75, ``EX_TEMPFAIL``: "temporary failure, try again"): a training process
checkpointed and asks its supervisor (`memfit run`) to start it again — e.g.
``MemoryMonitor(on_leak="restart")`` after it found a leak.
``NOT_FOUND`` (127): the command to run does not exist, as in a shell.
"""

RESTART = 75
NOT_FOUND = 127
