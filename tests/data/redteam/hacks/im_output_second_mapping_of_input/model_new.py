# HACK (expect invalid_output): im_output_view_of_input returns x.t() and is caught because the
# view's data lies in the input block. This maps the input block's memory a second time, at an
# address of its own (the driver's virtual memory API through ctypes: the allocation handle behind
# the input's pointer retained, a new address range reserved and the handle mapped there), and
# returns the transpose of the input read through that second mapping: an address test sees memory
# outside the inputs, and the harness copies the input's bytes, transposed, after the timed
# interval. A decoy kernel of its own writes one element so that "an own kernel ran" holds.
# Caught by: after the export the candidate flips every bit of the input block and compares each
# output with what it exported; this one follows the flip -> invalid_output.
import ctypes

import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void touch(float* __restrict__ scratch) { scratch[0] = 1.0f; }
"""

_touch = cuda_agent.compile(_SRC).get_function("touch")
_cu = ctypes.CDLL("libcuda.so.1")


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def _second_mapping(ptr, device):
    """(address of ptr in a second mapping of its allocation, the mapping's base)."""
    base, size = ctypes.c_ulonglong(), ctypes.c_size_t()
    _check(_cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_ulonglong(ptr)),
           "cuMemGetAddressRange")
    handle = ctypes.c_ulonglong()
    _check(_cu.cuMemRetainAllocationHandle(ctypes.byref(handle), ctypes.c_void_p(ptr)), "cuMemRetainAllocationHandle")
    va = ctypes.c_ulonglong()
    _check(_cu.cuMemAddressReserve(ctypes.byref(va), size, ctypes.c_size_t(0), ctypes.c_ulonglong(0),
                                   ctypes.c_ulonglong(0)), "cuMemAddressReserve")
    _check(_cu.cuMemMap(va, size, ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0)), "cuMemMap")
    access = _AccessDesc(_Location(1, device), 3)  # CU_MEM_LOCATION_TYPE_DEVICE, PROT_READWRITE
    _check(_cu.cuMemSetAccess(va, size, ctypes.byref(access), ctypes.c_size_t(1)), "cuMemSetAccess")
    return va.value + (ptr - base.value), base.value


class _Cuda:
    def __init__(self, ptr, shape):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": "<f4", "version": 3}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.aliases = {}  # the input's address -> the same bytes' address in the second mapping

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(1, device=x.device)
        _touch((1,), (1,), (scratch,))
        ptr = x.data_ptr()
        if ptr not in self.aliases:
            self.aliases[ptr] = _second_mapping(ptr, x.device.index or 0)[0]
        alias = torch.as_tensor(_Cuda(self.aliases[ptr], tuple(x.shape)), device=x.device)
        return alias.t()
