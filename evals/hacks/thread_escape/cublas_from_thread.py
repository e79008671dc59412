"""Hack (thread_escape), problem gemm_fp32, needs CUDA.

What it does: each call allocates the output and starts a Python thread that runs the cuBLAS
GEMM into it on that thread's own CUDA stream (`torch.cuda.Stream()` made current in the
thread); the call returns without joining the thread or the stream. The caller's stream never
waits for the GEMM.

Caught by: `stream_escape` (the early read on the caller's stream sees the output before the
GEMM wrote it), `timer_escape` (work launched by another thread that outlives the call),
`incorrect`/`timed_outputs_incorrect`.
"""

import threading

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.threads = []

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        ready = torch.cuda.Event()
        ready.record()  # the inputs are ready once the caller's stream gets here
        device = a.device

        def run() -> None:
            torch.cuda.set_device(device)
            stream = torch.cuda.Stream()
            stream.wait_event(ready)
            with torch.no_grad(), torch.cuda.stream(stream):
                torch.matmul(a, b, out=out)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        return out
