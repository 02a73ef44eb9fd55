// Reentrant activation checkpointing (see checkpoint.h).
#include "torch_fmt.h"  // first: see there
#include "checkpoint.h"

#include <cstdint>

namespace cuda_agent::lm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Module pointers ride in saved_data as integers: IValue has no slot for a raw pointer.
template <typename T>
int64_t as_int(T* p) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(p));
}
template <typename T>
T* as_ptr(const c10::IValue& v) {
  return reinterpret_cast<T*>(static_cast<intptr_t>(v.toInt()));
}

class LayerFunction : public torch::autograd::Function<LayerFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin, DecoderLayerImpl* layer) {
    ctx->save_for_backward({x, cos, sin});
    ctx->saved_data["layer"] = as_int(layer);
    LayerInputs in;
    in.cos = cos;
    in.sin = sin;
    return layer->forward(x, in);  // autograd is off inside forward: nothing is kept
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto* layer = as_ptr<DecoderLayerImpl>(ctx->saved_data["layer"]);
    auto x = saved[0].detach().requires_grad_(true);
    LayerInputs in;
    in.cos = saved[1];
    in.sin = saved[2];
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = layer->forward(x, in);
    }
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class HeadFunction : public torch::autograd::Function<HeadFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& targets,
                               CausalLMImpl* model, double temperature) {
    ctx->save_for_backward({hidden, targets});
    ctx->saved_data["model"] = as_int(model);
    ctx->saved_data["temperature"] = temperature;
    return head_stats(*model, hidden, targets, temperature);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto* model = as_ptr<CausalLMImpl>(ctx->saved_data["model"]);
    auto hidden = saved[0].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = head_stats(*model, hidden, saved[1], ctx->saved_data["temperature"].toDouble());
    }
    torch::autograd::backward({out}, {grads[0]});
    return {hidden.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Parameters receive gradients only if backward reaches the function, i.e. if its output
// requires grad; a frozen embedding would otherwise silently stop every layer's gradient.
torch::Tensor differentiable(const torch::Tensor& x) {
  return x.requires_grad() ? x : x.detach().requires_grad_(true);
}

}  // namespace

torch::Tensor checkpointed_layer(DecoderLayerImpl& layer, const torch::Tensor& x, const LayerInputs& in) {
  return LayerFunction::apply(differentiable(x), in.cos, in.sin, &layer);
}

torch::Tensor head_stats(CausalLMImpl& model, const torch::Tensor& hidden, const torch::Tensor& targets,
                         double temperature) {
  auto logits = model.logits(hidden).to(torch::kFloat32);
  auto logp = torch::log_softmax(temperature == 1.0 ? logits : logits / temperature, -1);
  auto token_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  auto entropy = -(logp.exp() * logp).sum(-1);
  return torch::stack({token_logp, entropy});
}

torch::Tensor checkpointed_head_stats(CausalLMImpl& model, const torch::Tensor& hidden, const torch::Tensor& targets,
                                      double temperature) {
  return HeadFunction::apply(differentiable(hidden), targets, &model, temperature);
}

}  // namespace cuda_agent::lm
