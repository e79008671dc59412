"""The GPU gate's shim: a small C library that makes a request's processes wait for its lease.

A process started by a request (the script of ``kcoral run python``, anything it starts, at any
depth) inherits two variables from its worker (``gate.py`` sets them):

* ``CUDA_INJECTION64_PATH`` names this library. The CUDA driver loads it inside the process's
  first ``cuInit`` and calls ``InitializeInjection`` before ``cuInit`` returns, whichever way the
  driver was reached (``cuInit`` itself, a pointer from ``cuGetProcAddress``, the runtime API,
  torch). ``InitializeInjection`` connects to the worker's gate (``KCORAL_GATE``: an abstract
  Unix socket name) and blocks until the worker answers that the request holds its GPU's lease.
* ``LD_PRELOAD`` names it too, as a backstop: its constructor runs at process start and does
  nothing unless ``CUDA_INJECTION64_PATH`` no longer names this library (a profiler such as
  ``ncu`` or ``compute-sanitizer`` put its own injection there, or the variable was unset) or
  the program is a known profiler; such a process takes the lease at once and keeps it for its
  whole life (the whole-run lease of the profilers, wherever they are started from). A profiler
  also loses ``CUDA_INJECTION64_PATH`` from its environment (``ncu`` refuses to start while
  another injection is named there; it names its own for the processes it profiles).

The connection stays open (close-on-exec) for the rest of the process's life: the worker ends
the hold when the connection reaches end of file and the process has exited, so the process's
context teardown stays under the lease. A process forked without ``exec`` shares the
connection, so the lease stays held while any of them lives. A refused or impossible connection
ends the process with a message (fail closed: no GPU work outside the lease).

The source is kept here as text (the runtime package ships ``.py`` files only, see
``runtime_file_list.ts``) and compiled with ``cc`` by ``build``: once per server start
(``python -m kcoral_runtime.gate_shim OUT_DIR``, server/workers/gate_library.ts), and by the
tests.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import List, Optional

LIBRARY_NAME = "libkcoral_gate.so"
"""The file name of the built library."""

EXIT_REFUSED = 86
"""The exit status of a process the gate could not admit (no gate, or the worker refused)."""

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef KCORAL_EXIT_REFUSED
#define KCORAL_EXIT_REFUSED 86
#endif

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t g_holder = 0; /* the process whose connection holds the lease (0: none) */

static void say(const char *a, const char *b) {
  const char *parts[3] = {"kcoral gate: ", a, b};
  for (int i = 0; i < 3; i++) {
    const char *s = parts[i];
    size_t n = s ? strlen(s) : 0;
    while (n > 0) {
      ssize_t w = write(2, s, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      s += w;
      n -= (size_t)w;
    }
  }
  (void)!write(2, "\n", 1);
}

static void refuse(const char *why, const char *detail) {
  say(why, detail);
  _exit(KCORAL_EXIT_REFUSED);
}

/* Connects to the worker's gate and blocks until it answers 'G' (the request holds the
   lease). The descriptor stays open for the process's life: its end of file tells the worker. */
static void take_lease(char reason) {
  pthread_mutex_lock(&g_lock);
  if (g_holder == getpid()) {
    pthread_mutex_unlock(&g_lock);
    return;
  }
  const char *name = getenv("KCORAL_GATE");
  if (name == NULL || name[0] == '\0') {
    refuse("KCORAL_GATE is not set: this process may not use the GPU outside its request's "
           "lease", "");
  }
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  size_t len = strlen(name);
  if (len >= sizeof addr.sun_path) refuse("KCORAL_GATE is too long: ", name);
  memcpy(addr.sun_path, name, len);
  if (name[0] == '@') addr.sun_path[0] = '\0'; /* an abstract socket */
  socklen_t size = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) refuse("cannot create a socket for the GPU lease: ", strerror(errno));
  int rc;
  do rc = connect(fd, (struct sockaddr *)&addr, size); while (rc < 0 && errno == EINTR);
  if (rc < 0) refuse("cannot reach the worker's GPU lease gate: ", strerror(errno));
  char ask[2] = {'A', reason};
  ssize_t n;
  do n = write(fd, ask, sizeof ask); while (n < 0 && errno == EINTR);
  if (n != (ssize_t)sizeof ask) refuse("cannot ask for the GPU lease: ", strerror(errno));
  char answer = 0;
  do n = read(fd, &answer, 1); while (n < 0 && errno == EINTR);
  if (n != 1 || answer != 'G') {
    refuse("the worker refused the GPU lease to this process (its request is over, or the "
           "process is not one of the request's)", "");
  }
  g_holder = getpid();
  pthread_mutex_unlock(&g_lock);
}

/* Called by the CUDA driver inside the process's first cuInit (CUDA_INJECTION64_PATH). */
int InitializeInjection(void) {
  take_lease('I');
  return 1;
}

static int same_file(const char *a, const char *b) {
  struct stat sa, sb;
  if (a == NULL || b == NULL || stat(a, &sa) != 0 || stat(b, &sb) != 0) return 0;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static const char *const PROFILERS[] = {
    "ncu", "nv-nsight-cu-cli", "compute-sanitizer", "cuda-memcheck", "nsys", "cuda-gdb", NULL};

static int is_profiler(void) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return 0;
  exe[n] = '\0';
  const char *base = strrchr(exe, '/');
  base = base ? base + 1 : exe;
  for (int i = 0; PROFILERS[i] != NULL; i++) {
    if (strcmp(base, PROFILERS[i]) == 0) return 1;
  }
  return 0;
}

/* At process start (LD_PRELOAD), and when the driver loads us: a process whose driver would
   load another injection library (or none), or a profiler, takes the lease now, for its life. */
__attribute__((constructor)) static void kcoral_gate_start(void) {
  if (getenv("KCORAL_GATE") == NULL) return; /* not started by a gated request */
  Dl_info self;
  if (dladdr((void *)&kcoral_gate_start, &self) == 0 || self.dli_fname == NULL) return;
  const char *injection = getenv("CUDA_INJECTION64_PATH");
  if (!same_file(injection, self.dli_fname)) {
    take_lease('O');
  } else if (is_profiler()) {
    take_lease('P');
    /* ncu refuses to start while CUDA_INJECTION64_PATH is set ("Another tool/injection might
       be loaded"); the profiler holds the lease from here, and the processes it starts take it
       through the LD_PRELOAD backstop (their injection is the profiler's, not this library). */
    unsetenv("CUDA_INJECTION64_PATH");
  }
}
"""


def c_compiler() -> Optional[str]:
    """The C compiler to build with: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on ``PATH``."""
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def source_digest() -> str:
    """SHA-256 of the shim's source (names a built library in a cache)."""
    return hashlib.sha256(SOURCE.encode("utf-8")).hexdigest()


def build(out_dir: str, compiler: Optional[str] = None) -> str:
    """Compiles the shim into ``out_dir/libkcoral_gate.so`` (made atomically, mode 0555) and
    returns its path. Raises ``RuntimeError`` naming the problem when there is no compiler or
    the compile fails."""
    cc = compiler or c_compiler()
    if cc is None:
        raise RuntimeError("no C compiler ($CC, cc, gcc or clang) to build the GPU lease gate")
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, LIBRARY_NAME)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as scratch:
        source = os.path.join(scratch, "kcoral_gate.c")
        with open(source, "w", encoding="utf-8") as f:
            f.write(SOURCE)
        built = os.path.join(scratch, LIBRARY_NAME)
        cmd: List[str] = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror",
                          f"-DKCORAL_EXIT_REFUSED={EXIT_REFUSED}", source, "-o", built,
                          "-ldl", "-lpthread"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"building the GPU lease gate failed ({' '.join(cmd)}): "
                f"{(proc.stdout + proc.stderr).strip()[-2000:]}"
            )
        os.chmod(built, 0o555)
        os.replace(built, target)
    return target


def main(argv: List[str]) -> int:
    """``python -m kcoral_runtime.gate_shim OUT_DIR``: builds the library, prints its path."""
    if len(argv) != 1:
        print("usage: python -m kcoral_runtime.gate_shim OUT_DIR", file=sys.stderr)
        return 2
    try:
        print(build(argv[0]))
    except (RuntimeError, OSError) as exc:
        print(f"kcoral gate: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
