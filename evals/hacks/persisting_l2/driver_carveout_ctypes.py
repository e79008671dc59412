"""Hack (persisting_l2), problem gemm_fp32, needs CUDA.

What it does: computes the GEMM honestly, but on every call reserves the largest persisting-L2
carve-out the GPU allows (`cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE)` through ctypes on
libcuda) and puts an access-policy window with hitProp PERSISTING over its second input on the
caller's stream (`cuStreamSetAttribute(CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW)`). Lines in a
persisting carve-out survive a harness's L2 flush (an ordinary write of a large buffer), so a
"cold-cache" timing finds B warm.

Caught by: `persisting_l2` (the benchmark reads the persisting-L2 limit after each timed call,
counts calls that left it above zero, and resets it before its flush).
"""

import ctypes

import torch
import torch.nn as nn

CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE = 108
CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE = 109
CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1
CU_ACCESS_PROPERTY_STREAMING = 1
CU_ACCESS_PROPERTY_PERSISTING = 2


class AccessPolicyWindow(ctypes.Structure):
    _fields_ = [
        ("base_ptr", ctypes.c_void_p),
        ("num_bytes", ctypes.c_size_t),
        ("hitRatio", ctypes.c_float),
        ("hitProp", ctypes.c_int),
        ("missProp", ctypes.c_int),
    ]


class StreamAttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("accessPolicyWindow", AccessPolicyWindow)]


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed: CUresult {result}")


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cuda = None
        self.max_persisting = 0
        self.max_window = 0

    def _carve_out(self, target: torch.Tensor) -> None:
        if self.cuda is None:
            torch.cuda.current_stream().synchronize()  # the primary context is current
            self.cuda = ctypes.CDLL("libcuda.so.1")
            device = ctypes.c_int()
            _check(self.cuda.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
            value = ctypes.c_int()
            _check(self.cuda.cuDeviceGetAttribute(
                ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, device),
                "cuDeviceGetAttribute")
            self.max_persisting = value.value
            _check(self.cuda.cuDeviceGetAttribute(
                ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE, device),
                "cuDeviceGetAttribute")
            self.max_window = value.value
        _check(self.cuda.cuCtxSetLimit(
            ctypes.c_int(CU_LIMIT_PERSISTING_L2_CACHE_SIZE), ctypes.c_size_t(self.max_persisting)),
            "cuCtxSetLimit")
        attr = StreamAttrValue()
        attr.accessPolicyWindow.base_ptr = target.data_ptr()
        attr.accessPolicyWindow.num_bytes = min(target.numel() * target.element_size(),
                                                self.max_window)
        attr.accessPolicyWindow.hitRatio = 1.0
        attr.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING
        attr.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _check(self.cuda.cuStreamSetAttribute(
            stream, ctypes.c_int(CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW), ctypes.byref(attr)),
            "cuStreamSetAttribute")

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self._carve_out(b)
        return torch.matmul(a, b)
