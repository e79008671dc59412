"""A convolution: nn.Conv2d 3x3, stride 1, padding 1, with bias, fp32, NCHW.

The weights are the module's parameters (constructed after torch.manual_seed(init_seed), so a
candidate that creates an nn.Conv2d with the same arguments first gets the same weights).
Sizes: batch 32, 64 -> 128 channels, 56 x 56 on a GPU; batch 2, 4 -> 8 channels, 16 x 16 in the
small variant (evals/README.md). cuDNN may run fp32 convolutions in TF32 (PyTorch's default), so
the tolerance is 1e-2: an honest fp32 candidate differs from a TF32 reference by ~1e-3.
"""

import os

import torch
import torch.nn as nn

_SCALE = os.environ.get("KCORAL_EVAL_SCALE") or ("full" if torch.cuda.is_available() else "small")
BATCH, C_IN, C_OUT, H, W = (2, 4, 8, 16, 16) if _SCALE == "small" else (32, 64, 128, 56, 56)
KSIZE = 3

FLOPS = 2 * BATCH * C_OUT * H * W * C_IN * KSIZE * KSIZE
BYTES = (BATCH * C_IN * H * W + C_OUT * C_IN * KSIZE * KSIZE + C_OUT + BATCH * C_OUT * H * W) * 4
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2}


class Model(nn.Module):
    """y = conv2d(x, weight, bias), 3x3, padding 1."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, C_IN, H, W)]


def get_init_inputs():
    return [C_IN, C_OUT, KSIZE]
