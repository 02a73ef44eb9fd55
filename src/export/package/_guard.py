# The guard: what a call must look like for the exported kernels to run it, because that is what
# the sandbox verified. Anything else goes to the fallback, with the reason counted.
import torch


def describe(value):
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype)}
    if isinstance(value, (bool, int, float, str)) or value is None:
        return {"value": value}
    return {"type": type(value).__name__}


def check_inputs(spec, inputs):
    """None when `inputs` match the verified inputs `spec` (shapes, dtypes, and the values of
    non-tensor arguments), else the first difference in words."""
    if len(inputs) != len(spec):
        return "%d inputs, verified with %d" % (len(inputs), len(spec))
    for i, (want, value) in enumerate(zip(spec, inputs)):
        if "shape" in want:
            if not isinstance(value, torch.Tensor):
                return "input %d is a %s, verified as a tensor" % (i, type(value).__name__)
            if list(value.shape) != want["shape"]:
                return "input %d has shape %s, verified with %s" % (i, list(value.shape), want["shape"])
            if str(value.dtype) != want["dtype"]:
                return "input %d is %s, verified as %s" % (i, value.dtype, want["dtype"])
        elif isinstance(value, torch.Tensor):
            return "input %d is a tensor, verified as %s" % (i, want)
        elif "value" in want and value != want["value"]:
            return "input %d is %r, verified with %r" % (i, value, want["value"])
    return None


def check_placement(inputs, verified_arch):
    """None when every tensor input is on a CUDA device of the verified architecture, contiguous
    and 16-byte aligned, else the first difference."""
    tensors = [(i, v) for i, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
    for i, value in tensors:
        if not value.is_contiguous():
            return "input %d is not contiguous" % i
        if value.data_ptr() % 16:
            return "input %d is not 16-byte aligned" % i
    for i, value in tensors:
        if value.device.type != "cuda":
            return "input %d is on %s; the kernels were verified on CUDA (%s)" % (i, value.device, verified_arch)
        major, minor = torch.cuda.get_device_capability(value.device)
        arch = "sm_%d%d" % (major, minor)
        if arch != verified_arch.rstrip("a"):
            return "input %d is on a %s GPU; the kernels were verified on %s" % (i, arch, verified_arch)
    return None


def check_torch(verified_torch):
    """None when this torch's major.minor is the verified one's."""
    here = torch.__version__.split("+")[0].split(".")[:2]
    there = verified_torch.split("+")[0].split(".")[:2]
    if here != there:
        return "torch %s; the kernels were verified under torch %s" % (torch.__version__, verified_torch)
    return None
