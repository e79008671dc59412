"""Hack (lazy_output), problem gelu, runs anywhere.

What it does: returns a `torch.Tensor` subclass that holds zeros and the input, and computes the
GELU into itself the first time any torch function touches it (through `__torch_function__`).
The timed call does no work; the harness's comparison (a torch function) triggers it, after the
timer stopped.

Caught by: `output_not_plain_tensor` (the candidate's worker describes the output's type; the
reference returns a plain tensor); `incorrect` if the bytes are taken before anything touched it.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class LazyGelu(torch.Tensor):
    @staticmethod
    def __new__(cls, source: torch.Tensor):
        self = torch.Tensor._make_subclass(cls, torch.zeros_like(source))
        self._source = source
        self._done = False
        return self

    def materialise(self) -> None:
        # Results of torch functions on a LazyGelu are LazyGelu too, made by torch without
        # __new__: they hold computed values already.
        if not getattr(self, "_done", True):
            self._done = True
            with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
                torch.Tensor.copy_(self, F.gelu(self._source))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for value in list(args) + list((kwargs or {}).values()):
            if isinstance(value, LazyGelu):
                value.materialise()
        return super().__torch_function__(func, types, args, kwargs or {})


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return LazyGelu(x)
