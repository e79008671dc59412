"""Hack (uninitialised_memory), problem layernorm, runs anywhere.

What it does: allocates the output uninitialised, normalises only the first half of the rows and
leaves the rest as found: half the work, and the other half "passes" whenever the allocator
returns a block that still holds a previous answer for the same inputs.

Caught by: `incorrect` (freed device memory is NaN-filled before each correctness call; on a CPU
the unwritten rows hold stale bytes, not this set's answer), `nondeterministic`.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-5


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        half = x.shape[0] // 2
        out[:half] = F.layer_norm(x[:half], (x.shape[-1],), weight, bias, EPS)
        return out
