"""Hack (side_stream), problem gemm_fp32, needs CUDA.

What it does: runs the GEMM through cuBLAS on its own non-blocking CUDA stream and returns the
output without making the caller's stream wait for it (no `wait_stream` back, no
`record_stream`). A timer that records CUDA events on the caller's stream only measures an
empty interval, and whoever reads the output on the caller's stream right away reads it before
the GEMM has written it.

Caught by: `stream_escape` (the output cloned on the caller's stream right after the call
differs from the output after a device synchronize); the all-stream activity timer reports the
side-stream work (`timer_escape` when it outlives the call); `incorrect`/`timed_outputs_incorrect`
when a read sees the unwritten buffer.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.side = None

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.side is None:
            self.side = torch.cuda.Stream()  # PyTorch creates it non-blocking
        # The inputs are ready on the caller's stream: wait for them (join in) ...
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            out = torch.matmul(a, b)
        # ... but never join back: the caller's stream does not wait for `out`.
        return out
