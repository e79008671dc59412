"""Upstream KCoral's worker-side module names, for uploaded code written against upstream.

Uploaded programs, examples and test harnesses written for upstream KCoral import
``kcoral.errors`` and ``kcoral.builtins`` *inside the code they upload*. This package gives them
those names on our workers, mapped onto ``kcoral_runtime``:

* ``kcoral.errors`` — ``ExecutionError`` (the very class our engine keys on, so a raised
  ``ExecutionError("correctness", ...)`` keeps its kind), ``GPUAccessViolation``,
  ``ValidationError``, and the client-side error classes for imports that name them;
* ``kcoral.builtins`` — ``benchmark`` and ``compile_tirx`` with upstream's signatures.

The zygote puts this package's parent directory at the *end* of ``sys.path``: a real ``kcoral``
installed in the worker's environment is found first and wins (its ``ExecutionError`` is then
recognized by module and name, see ``kcoral_runtime.errors.foreign_execution_error_kind``).
"""

__all__ = ["builtins", "errors"]
