import torch
import torch.nn as nn


class Model(nn.Module):
    """A deep narrow MLP in the manner of KernelBench L3 DeepNarrowMLP: 16 hidden layers of width 50
    with ReLU. Default initialisation shrinks the signal layer by layer, so the outputs (~0.01-0.1)
    barely depend on the input: within atol = rtol = 1e-2 of each other for any two inputs. A
    degenerate task: an output computed once passes every trial."""

    def __init__(self, input_size: int, hidden: int, depth: int, output_size: int):
        super().__init__()
        layers = [nn.Linear(input_size, hidden), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        layers.append(nn.Linear(hidden, output_size))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


batch = 64
input_size = 1000


def get_inputs():
    return [torch.randn(batch, input_size)]


def get_init_inputs():
    return [input_size, 50, 16, 10]
