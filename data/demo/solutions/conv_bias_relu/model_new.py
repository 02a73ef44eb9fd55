# Reference solution for demo/conv_bias_relu: a single cuDNN convolution with the
# bias add and the ReLU fused, through cuda_agent.conv2d.
import torch
import torch.nn as nn

import cuda_agent


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=kernel_size, padding=padding)
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_agent.conv2d(
            x.contiguous(),
            self.conv.weight,
            self.conv.bias,
            stride=1,
            padding=self.padding,
            dilation=1,
            groups=1,
            activation="relu",
        )
