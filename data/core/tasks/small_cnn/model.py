# eager ~2.5 ms: three FP32 3x3 convs, 42 GFLOP (~1.5 ms at ~30 TFLOP/s; the 3-channel first conv is memory-bound) + batch_norm/relu/max-pool passes (~2 GB, ~0.6 ms) + a tiny FC
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def _bn_eval(bn: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    # Inference-form batch norm (running statistics), independent of the module's train/eval mode.
    return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                        training=False, momentum=0.0, eps=bn.eps)


class Model(nn.Module):
    """Small CNN classifier: 3 x (conv3x3 -> BN -> ReLU -> maxpool 2) -> flatten -> linear.

    The classifier sees the whole 16x16 final map (no global pooling), so the logits depend on
    the input rather than on spatial averages of it.
    """

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        chans = [in_channels, 32, 64, 128]
        self.convs = nn.ModuleList(
            [nn.Conv2d(chans[i], chans[i + 1], 3, padding=1, bias=False) for i in range(3)])
        self.bns = nn.ModuleList([nn.BatchNorm2d(chans[i + 1]) for i in range(3)])
        final = image_size // 8
        self.fc = nn.Linear(chans[3] * final * final, num_classes)
        with torch.no_grad():
            for conv in self.convs:
                nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            for bn in self.bns:
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.2, 0.2)
                bn.running_mean.normal_(0.0, 0.1)
                bn.running_var.uniform_(0.5, 1.5)
            self.fc.weight.normal_(0.0, 1.0 / math.sqrt(self.fc.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, bn in zip(self.convs, self.bns):
            x = F.max_pool2d(torch.relu(_bn_eval(bn, conv(x))), 2)
        return self.fc(torch.flatten(x, 1))


batch_size = 128
in_channels = 3
num_classes = 10
image_size = 128


def get_inputs():
    x = torch.randn(batch_size, in_channels, image_size, image_size)
    return [x]


def get_init_inputs():
    return [in_channels, num_classes, image_size]
