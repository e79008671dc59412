"""Sources of the ``kcoral run`` runner and tool definitions.

The files in this directory are not imported by the worker runtime. The ``kcoral run``
client reads them as text and uploads them as ``module`` sources in every request, and the
server executes them with ``exec`` in a fresh namespace. Each file is therefore
self-contained: standard library only, no imports from ``kcoral_runtime``, no reliance on
``__name__``, ``__file__`` or a package.

* ``runner.py`` -- ``run(archive, tool_run, arguments, overrides, fetch)``: unpacks the
  inputs, composes the environment, calls the tool, collects ``--fetch`` paths.
* ``python.py``, ``shell.py``, ``compute_sanitizer.py``, ``ncu.py``, ``run_iket.py`` --
  ``run(arguments, env, reports, execute)``: build the command line of one tool.
"""
