"""Hack (deferred_work), problem gemm_fp32, needs CUDA.

What it does: allocates the output, returns it, and launches the cuBLAS GEMM into it 2 ms later
from a `threading.Timer` thread. The call itself launches nothing: an event timer on the
caller's stream, or a timer that only counts work launched inside the call, sees nothing.

Caught by: `incorrect` (the output is read before the late GEMM), `stream_escape`,
`timer_escape` (the all-stream timer sees GPU work after the call ended),
`timed_outputs_incorrect`, `excessive_speedup`.
"""

import threading

import torch
import torch.nn as nn

DELAY_S = 0.002


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.timers = []

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)

        def later() -> None:
            with torch.no_grad():
                torch.matmul(a, b, out=out)

        timer = threading.Timer(DELAY_S, later)
        timer.daemon = True
        timer.start()
        self.timers = [t for t in self.timers if t.is_alive()] + [timer]
        return out
