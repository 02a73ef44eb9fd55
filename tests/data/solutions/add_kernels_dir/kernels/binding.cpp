// CUDA-Agent layout test (add_kernels_dir): Python binding for the launcher in add.cu.
#include <torch/extension.h>

torch::Tensor add_forward(torch::Tensor a, torch::Tensor b);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("add_forward", &add_forward, "out = a + b (float32, CUDA)");
}
