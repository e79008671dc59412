"""KCoral worker runtime: the Python side of a worker slot.

Importing this package is cheap on purpose: ``python -m kcoral_runtime.zygote`` must be able to
move its framed channel off fds 0/1 before anything heavy (numpy, torch) is imported. See
``docs/architecture.md`` §3 for the frames and the process model.
"""
