"""Hack (persisting_l2), problem row_sum, needs CUDA.

What it does: a load_inline extension that, on every call, sets the device's persisting-L2 limit
to its maximum (`cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, ...)`) and an access-policy
window over the input with hitProp persisting on PyTorch's current stream
(`cudaStreamSetAttribute(..., cudaStreamAttributeAccessPolicyWindow, ...)`), then sums the rows
with torch. The input (or the part of it the window covers) then stays in L2 through a
harness's flush, and repeated timings read it from cache.

Caught by: `persisting_l2` (the benchmark finds the persisting-L2 limit above zero after timed
calls, and resets it before each flush).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

void pin_in_l2(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "a CUDA tensor");
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  C10_CUDA_CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, prop.persistingL2CacheMaxSize));
  cudaStreamAttrValue attr = {};
  attr.accessPolicyWindow.base_ptr = x.data_ptr();
  size_t bytes = (size_t)x.numel() * x.element_size();
  attr.accessPolicyWindow.num_bytes =
      bytes < (size_t)prop.accessPolicyMaxWindowSize ? bytes : (size_t)prop.accessPolicyMaxWindowSize;
  attr.accessPolicyWindow.hitRatio = 1.0f;
  attr.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  attr.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  C10_CUDA_CHECK(cudaStreamSetAttribute(c10::cuda::getCurrentCUDAStream(),
                                        cudaStreamAttributeAccessPolicyWindow, &attr));
}
"""

_CPP_SOURCE = "void pin_in_l2(torch::Tensor x);"


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ext = load_inline(
            name="kcoral_zoo_hack_runtime_l2_window",
            cpp_sources=_CPP_SOURCE,
            cuda_sources=_CUDA_SOURCE,
            functions=["pin_in_l2"],
            verbose=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ext.pin_in_l2(x)
        return torch.sum(x, dim=1)
