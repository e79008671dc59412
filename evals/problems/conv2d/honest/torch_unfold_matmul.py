"""Honest: convolution as im2col + GEMM: F.unfold gathers the 3x3 patches, one matmul with the
flattened weights, plus the bias. The nn.Conv2d only holds the parameters (same weights).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        cols = F.unfold(x, k, padding=k // 2)  # (n, c_in * k * k, h * w)
        weight = self.conv.weight.reshape(self.conv.out_channels, -1)
        out = torch.matmul(weight, cols) + self.conv.bias[None, :, None]
        return out.reshape(n, self.conv.out_channels, h, w)
