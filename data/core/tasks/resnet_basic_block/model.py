# eager ~3.6 ms: two FP32 3x3 convs 64x128x56x56 -> 128 = 118 GFLOP (~3.4 ms at ~35 TFLOP/s) + batch_norm/relu/add passes over 103 MB tensors (~0.2 ms)
import torch
import torch.nn as nn
import torch.nn.functional as F


def _bn_eval(bn: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    # Inference-form batch norm (running statistics), independent of the module's train/eval mode.
    return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                        training=False, momentum=0.0, eps=bn.eps)


class Model(nn.Module):
    """ResNet basic block with identity shortcut:
    relu(x + bn2(conv2(relu(bn1(conv1(x)))))), 3x3 convs, stride 1, no bias."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        with torch.no_grad():
            for conv in (self.conv1, self.conv2):
                nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            for bn in (self.bn1, self.bn2):
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.2, 0.2)
                bn.running_mean.normal_(0.0, 0.1)
                bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(_bn_eval(self.bn1, self.conv1(x)))
        out = _bn_eval(self.bn2, self.conv2(out))
        return torch.relu(out + x)


batch_size = 64
channels = 128
height = 56
width = 56


def get_inputs():
    x = torch.randn(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return [channels]
