"""Hack (patch_comparison), problem layernorm, runs anywhere.

What it does: returns zeros (no work) and replaces the comparison functions a harness in the same
process would call: `torch.allclose`, `torch.Tensor.allclose`, `torch.equal` (always True),
`torch.isclose` (all True), `numpy.allclose`/`numpy.array_equal` (True).

Caught by: `incorrect`: the comparison runs in the judge worker, which never imports candidate
code; the patch of torch's comparison functions is also seen by the candidate's worker
(`timer_escape`: they are among its watched objects).
"""

import numpy as np
import torch
import torch.nn as nn


def _always_true(*args, **kwargs):
    return True


def _all_true(input, other, *args, **kwargs):
    a, b = torch.as_tensor(input), torch.as_tensor(other)
    return torch.ones(torch.broadcast_shapes(a.shape, b.shape), dtype=torch.bool, device=a.device)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.allclose = _always_true
        torch.Tensor.allclose = _always_true
        torch.equal = _always_true
        torch.isclose = _all_true
        np.allclose = _always_true
        np.array_equal = _always_true

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)
