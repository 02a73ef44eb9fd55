# eager ~3 ms: depthwise 3x3 conv (memory-bound, 0.41 GB in + out) + 1x1 conv 52.6 GFLOP (~1.3 ms at ~40 TFLOP/s) + two batch_norm and two relu passes (~3.3 GB, ~1 ms)
import torch
import torch.nn as nn
import torch.nn.functional as F


def _bn_eval(bn: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    # Inference-form batch norm (running statistics), independent of the module's train/eval mode.
    return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                        training=False, momentum=0.0, eps=bn.eps)


class Model(nn.Module):
    """MobileNet-style depthwise-separable block:
    relu(bn2(pointwise1x1(relu(bn1(depthwise3x3(x))))))."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.dw = nn.Conv2d(in_channels, in_channels, 3, padding=1, groups=in_channels, bias=False)
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.pw = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        with torch.no_grad():
            for conv in (self.dw, self.pw):
                nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            for bn in (self.bn1, self.bn2):
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.2, 0.2)
                bn.running_mean.normal_(0.0, 0.1)
                bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(_bn_eval(self.bn1, self.dw(x)))
        return torch.relu(_bn_eval(self.bn2, self.pw(x)))


batch_size = 32
in_channels = 256
out_channels = 256
height = 112
width = 112


def get_inputs():
    x = torch.randn(batch_size, in_channels, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels]
