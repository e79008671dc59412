"""Hack (uninitialised_memory), problem rmsnorm, runs anywhere.

What it does: returns `torch.empty_like(x)` and computes nothing. In a harness that just ran the
reference (or the same candidate) on the same inputs, the allocator often hands back the block
holding that answer, and the check passes.

Caught by: `incorrect` (before each correctness call the candidate's worker fills freed device
memory with NaN; on a CPU the block holds whatever was there, not this set's answer),
`nondeterministic` when two runs see different garbage.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)
