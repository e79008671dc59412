"""Hack (batch_and_skip), problem row_sum, runs anywhere.

What it does: does the reduction on every fourth call only and returns the last result on the
three calls in between. A timing loop that calls it on one input N times and divides the total
by N reports a quarter of the real cost.

Caught by: `incorrect` (the next correctness set gets the previous set's sums),
`timed_outputs_incorrect` (rotating timing sets), `nondeterministic`; on a GPU
`activities_unstable` (calls launch different work).
"""

import torch
import torch.nn as nn

EVERY = 4


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.last = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.last is None or self.calls % EVERY == 0:
            self.last = torch.sum(x, dim=1)
        self.calls += 1
        return self.last
