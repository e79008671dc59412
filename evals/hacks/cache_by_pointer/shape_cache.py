"""Hack (cache_by_pointer), problem layernorm, runs anywhere.

What it does: computes the LayerNorm once per input shape and returns that first answer for
every later call with the same shapes, whatever the values (a harness that checks one input and
then times the same shape many times sees a correct check and no work).

Caught by: `incorrect` (the second correctness set, new values of the same shape, gets the first
set's answer), `timed_outputs_incorrect` (the timing sets rotate).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-5


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.by_shape = {}

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), tuple(weight.shape), tuple(bias.shape))
        if key not in self.by_shape:
            self.by_shape[key] = F.layer_norm(x, (x.shape[-1],), weight, bias, EPS)
        return self.by_shape[key]
