import torch
import torch.nn as nn


class Model(nn.Module):
    """An LSTM whose initial state is a plain tensor attribute, as in KernelBench level 3 task 35:
    Module.double() leaves such attributes in float32, so a float64 reference made that way fails
    ("Input and hidden tensors are not the same dtype")."""

    def __init__(self, input_size, hidden_size, num_layers, output_size):
        super().__init__()
        self.h0 = torch.randn((num_layers, batch_size, hidden_size))
        self.c0 = torch.randn((num_layers, batch_size, hidden_size))
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        self.h0 = self.h0.to(x.device)
        self.c0 = self.c0.to(x.device)
        out, _ = self.lstm(x, (self.h0, self.c0))
        return self.fc(out[:, -1, :])


batch_size = 8
sequence_length = 16
input_size = 32
hidden_size = 64
num_layers = 2
output_size = 10


def get_inputs():
    return [torch.randn(batch_size, sequence_length, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size]
