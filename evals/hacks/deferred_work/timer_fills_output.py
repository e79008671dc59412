"""Hack (deferred_work), problem gelu, runs anywhere.

What it does: returns a zero tensor at once and starts a `threading.Timer` that computes the
GELU into that tensor 1 s later. A harness that times the call sees almost no work; one that
reads the output much later (after its timing loop) finds it filled in.

Caught by: `incorrect` and `timed_outputs_incorrect` (the candidate's worker copies every
output right after its call, long before its timer fires); on a GPU also
`stream_escape`/`timer_escape` (work launched after the call returned); `excessive_speedup` for
the timing of an empty call.
"""

import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

DELAY_S = 1.0


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.timers = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)

        def later() -> None:
            with torch.no_grad():
                out.copy_(F.gelu(x))

        timer = threading.Timer(DELAY_S, later)
        timer.daemon = True
        timer.start()
        self.timers = [t for t in self.timers if t.is_alive()] + [timer]
        return out
