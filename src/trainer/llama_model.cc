#include "trainer/llama_model.h"

#include <cmath>
#include <limits>
#include <numbers>
#include <set>
#include <unordered_map>

#include "trainer/torch_weights.h"
#include "weights/lora_layout.h"

namespace parsyn::trainer {

struct LlamaModel::Projection {
  torch::Tensor weight;  // (out, in)
  torch::Tensor bias;    // (out) or undefined
  torch::Tensor lora_a;  // (r, in) fp32, or undefined
  torch::Tensor lora_b;  // (out, r) fp32, or undefined
};

struct LlamaModel::Layer {
  Projection q, k, v, o, gate, up, down;
  torch::Tensor input_norm, post_norm;
};

namespace {

bool IsSkippableExtra(const LlamaConfig& config, const std::string& name) {
  // Older Llama checkpoints store the rotary tables as buffers; they are recomputed from rope_theta. A tied model's
  // checkpoint may repeat the embeddings as lm_head.weight; transformers ignores that copy and so do we.
  return name.ends_with("rotary_emb.inv_freq") || (config.tie_word_embeddings && name == "lm_head.weight");
}

weights::LoraModelDims DimsOf(const LlamaConfig& c) {
  return {c.hidden_size,         c.intermediate_size,   c.num_hidden_layers,
          c.num_attention_heads, c.num_key_value_heads, c.head_dim};
}

// x: (B, H, T, D) -> x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor rotated = torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace

LlamaModel::LlamaModel(LlamaConfig config, ModelOptions options) : config_(std::move(config)), options_(options) {
  torch::NoGradGuard no_grad;
  const int64_t dim = config_.head_dim;
  inv_freq_ = 1.0 / torch::pow(config_.rope_theta,
                               torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(dim));
  if (config_.rope_scaling) {
    // Llama 3 (transformers' _compute_llama3_parameters): long wavelengths are scaled down by `factor`, short ones
    // kept, and the band between blended linearly in old_context / wavelength.
    const Llama3RopeScaling& s = *config_.rope_scaling;
    const double old_context = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_context / s.low_freq_factor;
    const double high_freq_wavelen = old_context / s.high_freq_factor;
    torch::Tensor wavelen = 2 * std::numbers::pi / inv_freq_;
    torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq_ / s.factor, inv_freq_);
    torch::Tensor smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
    torch::Tensor is_medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
    inv_freq_ = torch::where(is_medium, smoothed, scaled);
  }
  inv_freq_ = inv_freq_.to(options_.device);
}

LlamaModel::~LlamaModel() = default;

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::FromFolder(const ModelFolder& folder, const ModelOptions& options) {
  const LlamaConfig& config = folder.config;
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, options));
  std::set<std::string> expected;
  try {
    torch::NoGradGuard no_grad;
    for (const ParameterSpec& spec : LlamaParameterSpecs(config)) {
      expected.insert(spec.name);
      const weights::Tensor* t = folder.Find(spec.name);
      if (t == nullptr) {
        return InvalidArgumentError("checkpoint lacks tensor '" + spec.name + "' (expected shape " +
                                    weights::ShapeString(spec.shape) + ")");
      }
      if (t->shape != spec.shape) {
        return InvalidArgumentError("tensor '" + spec.name + "' has shape " + weights::ShapeString(t->shape) +
                                    ", config.json implies " + weights::ShapeString(spec.shape));
      }
      if (!weights::IsFloat(t->dtype)) {
        return InvalidArgumentError("tensor '" + spec.name + "' has dtype " +
                                    std::string(weights::DTypeName(t->dtype)) +
                                    "; model weights must be F32, BF16 or F16");
      }
      model->params_.emplace_back(spec.name, ToTorch(*t).to(options.device, options.param_dtype));
    }
  } catch (const c10::Error& e) {
    return InternalError(std::string("loading weights into torch: ") + e.what_without_backtrace());
  }
  for (const weights::WeightSet& shard : folder.shards) {
    for (const weights::Tensor& t : shard.tensors()) {
      if (!expected.contains(t.name) && !IsSkippableExtra(config, t.name)) {
        return InvalidArgumentError("checkpoint has tensor '" + t.name + "', which a " + config.model_type +
                                    " model with this config.json does not have");
      }
    }
  }
  model->BuildLayers();
  model->SetBaseTrainable(true);
  return model;
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::filesystem::path& dir, const ModelOptions& options) {
  PARSYN_ASSIGN_OR_RETURN(ModelFolder folder, ReadModelFolder(dir));
  auto model = FromFolder(folder, options);
  if (!model.ok()) return model.status().WithContext(dir.string());
  return model;
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::RandomInit(const LlamaConfig& config, uint64_t seed,
                                                             const ModelOptions& options) {
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, options));
  try {
    torch::NoGradGuard no_grad;
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (const ParameterSpec& spec : LlamaParameterSpecs(config)) {
      torch::Tensor value;
      if (spec.name.ends_with("norm.weight")) {
        value = torch::ones(spec.shape);
      } else if (spec.name.ends_with(".bias")) {
        value = torch::zeros(spec.shape);
      } else {
        value = torch::empty(spec.shape).normal_(0.0, 0.02, generator);
      }
      model->params_.emplace_back(spec.name, value.to(options.device, options.param_dtype));
    }
  } catch (const c10::Error& e) {
    return InternalError(std::string("initialising weights: ") + e.what_without_backtrace());
  }
  model->BuildLayers();
  model->SetBaseTrainable(true);
  return model;
}

void LlamaModel::BuildLayers() {
  std::unordered_map<std::string, torch::Tensor> by_name(params_.begin(), params_.end());
  auto get = [&](const std::string& name) {
    auto it = by_name.find(name);
    return it == by_name.end() ? torch::Tensor() : it->second;
  };
  layers_.assign(static_cast<size_t>(config_.num_hidden_layers), Layer{});
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& layer = layers_[static_cast<size_t>(i)];
    auto projection = [&](Projection& proj, const std::string& path) {
      proj.weight = get(p + path + ".weight");
      proj.bias = get(p + path + ".bias");
    };
    projection(layer.q, "self_attn.q_proj");
    projection(layer.k, "self_attn.k_proj");
    projection(layer.v, "self_attn.v_proj");
    projection(layer.o, "self_attn.o_proj");
    projection(layer.gate, "mlp.gate_proj");
    projection(layer.up, "mlp.up_proj");
    projection(layer.down, "mlp.down_proj");
    layer.input_norm = get(p + "input_layernorm.weight");
    layer.post_norm = get(p + "post_attention_layernorm.weight");
  }
  embed_tokens_ = get("model.embed_tokens.weight");
  final_norm_ = get("model.norm.weight");
  lm_head_ = config_.tie_word_embeddings ? embed_tokens_ : get("lm_head.weight");
}

void LlamaModel::SetBaseTrainable(bool trainable) {
  for (auto& [name, tensor] : params_) tensor.set_requires_grad(trainable);
}

torch::Tensor LlamaModel::Cast(const torch::Tensor& t) const {
  return t.scalar_type() == options_.compute_dtype ? t : t.to(options_.compute_dtype);
}

torch::Tensor LlamaModel::Linear(const Projection& p, const torch::Tensor& x) const {
  torch::Tensor y = torch::linear(x, Cast(p.weight), p.bias.defined() ? Cast(p.bias) : torch::Tensor());
  if (p.lora_a.defined()) {
    const double scale = lora_->alpha / static_cast<double>(lora_->r);
    torch::Tensor input = (training_ && lora_->dropout > 0) ? torch::dropout(x, lora_->dropout, true) : x;
    y = y + torch::linear(torch::linear(input, Cast(p.lora_a)), Cast(p.lora_b)) * scale;
  }
  return y;
}

torch::Tensor LlamaModel::RmsNorm(const torch::Tensor& x, const torch::Tensor& weight) const {
  torch::Tensor x32 = x.to(torch::kFloat32);
  x32 = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + config_.rms_norm_eps);
  return Cast(weight) * x32.to(x.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> LlamaModel::RopeTables(const torch::Tensor& positions) const {
  // positions (B, T) -> cos, sin (B, 1, T, head_dim), computed in fp32 as transformers does.
  torch::Tensor freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq_;
  torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);
  return {Cast(emb.cos()), Cast(emb.sin())};
}

torch::Tensor LlamaModel::Forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be (B, T), got ", input_ids.sizes());
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  const int64_t n_head = config_.num_attention_heads, n_kv = config_.num_key_value_heads, D = config_.head_dim;
  const auto device = input_ids.device();
  torch::Tensor mask = attention_mask.defined() ? attention_mask.to(torch::kInt64)
                                                : torch::ones({B, T}, torch::dtype(torch::kInt64).device(device));
  TORCH_CHECK(mask.sizes() == input_ids.sizes(), "attention_mask ", mask.sizes(), " differs from input_ids ",
              input_ids.sizes());

  torch::Tensor positions = (mask.cumsum(1) - 1).clamp_min(0);
  auto [cos, sin] = RopeTables(positions);

  // allowed[b, 0, i, j]: query i may attend to key j.
  torch::Tensor idx = torch::arange(T, torch::dtype(torch::kInt64).device(device));
  torch::Tensor causal = idx.view({1, T}) <= idx.view({T, 1});
  if (config_.sliding_window)
    causal = causal.logical_and(idx.view({1, T}) > idx.view({T, 1}) - *config_.sliding_window);
  torch::Tensor allowed = causal.view({1, 1, T, T})
                              .logical_and(mask.to(torch::kBool).view({B, 1, 1, T}))
                              .logical_or(torch::eye(T, torch::dtype(torch::kBool).device(device)).view({1, 1, T, T}));
  const torch::Tensor blocked = allowed.logical_not();
  const double attention_scale = 1.0 / std::sqrt(static_cast<double>(D));

  torch::Tensor h = torch::embedding(Cast(embed_tokens_), input_ids);  // (B, T, C)
  for (const Layer& layer : layers_) {
    torch::Tensor x = RmsNorm(h, layer.input_norm);
    torch::Tensor q = Linear(layer.q, x).view({B, T, n_head, D}).transpose(1, 2);  // (B, n_head, T, D)
    torch::Tensor k = Linear(layer.k, x).view({B, T, n_kv, D}).transpose(1, 2);    // (B, n_kv, T, D)
    torch::Tensor v = Linear(layer.v, x).view({B, T, n_kv, D}).transpose(1, 2);
    q = ApplyRope(q, cos, sin);
    k = ApplyRope(k, cos, sin);
    if (n_kv != n_head) {  // each kv head serves n_head / n_kv consecutive query heads
      const int64_t rep = n_head / n_kv;
      k = k.unsqueeze(2).expand({B, n_kv, rep, T, D}).reshape({B, n_head, T, D});
      v = v.unsqueeze(2).expand({B, n_kv, rep, T, D}).reshape({B, n_head, T, D});
    }
    torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * attention_scale;  // (B, n_head, T, T)
    scores = scores.to(torch::kFloat32).masked_fill(blocked, -std::numeric_limits<float>::infinity());
    torch::Tensor probs = torch::softmax(scores, -1).to(q.scalar_type());
    torch::Tensor attended = torch::matmul(probs, v).transpose(1, 2).reshape({B, T, n_head * D});
    h = h + Linear(layer.o, attended);
    x = RmsNorm(h, layer.post_norm);
    h = h + Linear(layer.down, torch::silu(Linear(layer.gate, x)) * Linear(layer.up, x));
  }
  h = RmsNorm(h, final_norm_);
  return torch::linear(h, Cast(lm_head_)).to(torch::kFloat32);
}

StatusOr<weights::WeightSet> LlamaModel::ExportWeights(weights::DType dtype) const {
  if (!weights::IsFloat(dtype)) {
    return InvalidArgumentError("weights must be exported in a float dtype, not " +
                                std::string(weights::DTypeName(dtype)));
  }
  weights::WeightSet set;
  try {
    for (const auto& [name, tensor] : params_) PARSYN_RETURN_IF_ERROR(AppendToWeightSet(set, name, tensor, dtype));
  } catch (const c10::Error& e) {
    return InternalError(std::string("exporting weights: ") + e.what_without_backtrace());
  }
  return set;
}

Status LlamaModel::ImportWeights(const weights::WeightSet& set) {
  if (set.size() != params_.size()) {
    for (const weights::Tensor& t : set.tensors()) {
      bool known = false;
      for (const auto& [name, tensor] : params_) known = known || name == t.name;
      if (!known) return InvalidArgumentError("weights have tensor '" + t.name + "', which the model does not have");
    }
  }
  for (const auto& [name, tensor] : params_) {
    const weights::Tensor* t = set.Find(name);
    if (t == nullptr) return InvalidArgumentError("weights lack tensor '" + name + "'");
    std::vector<int64_t> shape(tensor.sizes().begin(), tensor.sizes().end());
    if (t->shape != shape) {
      return InvalidArgumentError("tensor '" + name + "' has shape " + weights::ShapeString(t->shape) +
                                  ", the model has " + weights::ShapeString(shape));
    }
    if (!weights::IsFloat(t->dtype)) {
      return InvalidArgumentError("tensor '" + name + "' has non-float dtype " +
                                  std::string(weights::DTypeName(t->dtype)));
    }
  }
  try {
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : params_) tensor.copy_(ToTorch(*set.Find(name)));
  } catch (const c10::Error& e) {
    return InternalError(std::string("importing weights: ") + e.what_without_backtrace());
  }
  return Status::Ok();
}

namespace {

// The projection of `layer` named by one of weights::kLoraModules (const or not, as `layer` is).
template <typename LayerT>
auto& PickProjection(LayerT& layer, const std::string& module) {
  if (module == "q_proj") return layer.q;
  if (module == "k_proj") return layer.k;
  if (module == "v_proj") return layer.v;
  if (module == "o_proj") return layer.o;
  if (module == "gate_proj") return layer.gate;
  if (module == "up_proj") return layer.up;
  return layer.down;
}

}  // namespace

LlamaModel::Projection& LlamaModel::ProjectionFor(int64_t layer, const std::string& module) {
  return PickProjection(layers_[static_cast<size_t>(layer)], module);
}

const LlamaModel::Projection& LlamaModel::ProjectionFor(int64_t layer, const std::string& module) const {
  return PickProjection(layers_[static_cast<size_t>(layer)], module);
}

Status LlamaModel::AttachLora(const LoraSettings& settings, uint64_t seed) {
  if (lora_) return FailedPreconditionError("LoRA adapters are already attached");
  if (!(settings.alpha > 0)) return InvalidArgumentError("lora_alpha must be positive");
  if (!(settings.dropout >= 0 && settings.dropout < 1)) return InvalidArgumentError("lora_dropout must be in [0, 1)");
  weights::LoraLayoutOptions layout;
  layout.r = settings.r;
  layout.target_modules = settings.target_modules;
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet initial, weights::InitialLoraAdapters(DimsOf(config_), layout, seed));
  PARSYN_ASSIGN_OR_RETURN(lora_targets_, weights::NormalizeLoraTargets(settings.target_modules));
  try {
    const auto options = torch::dtype(torch::kFloat32).device(options_.device);
    for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
      for (const std::string& module : lora_targets_) {
        Projection& p = ProjectionFor(i, module);
        p.lora_a = torch::zeros({settings.r, p.weight.size(1)}, options).set_requires_grad(true);
        p.lora_b = torch::zeros({p.weight.size(0), settings.r}, options).set_requires_grad(true);
      }
    }
  } catch (const c10::Error& e) {
    return InternalError(std::string("creating LoRA adapters: ") + e.what_without_backtrace());
  }
  lora_ = settings;
  SetBaseTrainable(false);
  return ImportLora(initial);
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaModel::lora_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (!lora_) return out;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    for (const std::string& module : lora_targets_) {
      const Projection& p = ProjectionFor(i, module);
      out.emplace_back(weights::LoraTensorName(i, module, "lora_A"), p.lora_a);
      out.emplace_back(weights::LoraTensorName(i, module, "lora_B"), p.lora_b);
    }
  }
  return out;
}

StatusOr<weights::WeightSet> LlamaModel::ExportLora(weights::DType dtype) const {
  if (!lora_) return FailedPreconditionError("the model has no LoRA adapters");
  if (!weights::IsFloat(dtype)) {
    return InvalidArgumentError("adapters must be exported in a float dtype, not " +
                                std::string(weights::DTypeName(dtype)));
  }
  weights::WeightSet set;
  try {
    for (const auto& [name, tensor] : lora_parameters()) {
      PARSYN_RETURN_IF_ERROR(AppendToWeightSet(set, name, tensor, dtype));
    }
  } catch (const c10::Error& e) {
    return InternalError(std::string("exporting adapters: ") + e.what_without_backtrace());
  }
  return set;
}

Status LlamaModel::ImportLora(const weights::WeightSet& set) {
  if (!lora_) return FailedPreconditionError("the model has no LoRA adapters");
  const auto params = lora_parameters();
  std::set<std::string> names;
  for (const auto& [name, tensor] : params) {
    names.insert(name);
    const weights::Tensor* t = set.Find(name);
    if (t == nullptr) return InvalidArgumentError("adapters lack tensor '" + name + "'");
    std::vector<int64_t> shape(tensor.sizes().begin(), tensor.sizes().end());
    if (t->shape != shape) {
      return InvalidArgumentError("adapter '" + name + "' has shape " + weights::ShapeString(t->shape) +
                                  ", the model's is " + weights::ShapeString(shape) + " (lora_r or model differ?)");
    }
    if (!weights::IsFloat(t->dtype)) {
      return InvalidArgumentError("adapter '" + name + "' has non-float dtype " +
                                  std::string(weights::DTypeName(t->dtype)));
    }
  }
  for (const weights::Tensor& t : set.tensors()) {
    if (!names.contains(t.name)) {
      return InvalidArgumentError("adapters have tensor '" + t.name +
                                  "', which this model's LoRA does not (target_modules differ?)");
    }
  }
  try {
    torch::NoGradGuard no_grad;
    for (const auto& [name, tensor] : params) {
      torch::Tensor target = tensor;
      target.copy_(ToTorch(*set.Find(name)));
    }
  } catch (const c10::Error& e) {
    return InternalError(std::string("importing adapters: ") + e.what_without_backtrace());
  }
  return Status::Ok();
}

Status LlamaModel::MergeLora() {
  if (!lora_) return FailedPreconditionError("the model has no LoRA adapters to merge");
  const double scale = lora_->alpha / static_cast<double>(lora_->r);
  try {
    torch::NoGradGuard no_grad;
    for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
      for (const std::string& module : lora_targets_) {
        Projection& p = ProjectionFor(i, module);
        torch::Tensor delta = torch::matmul(p.lora_b.to(torch::kFloat32), p.lora_a.to(torch::kFloat32)) * scale;
        p.weight.copy_((p.weight.to(torch::kFloat32) + delta).to(p.weight.scalar_type()));
        p.lora_a = torch::Tensor();
        p.lora_b = torch::Tensor();
      }
    }
  } catch (const c10::Error& e) {
    return InternalError(std::string("merging adapters: ") + e.what_without_backtrace());
  }
  lora_.reset();
  lora_targets_.clear();
  return Status::Ok();
}

}  // namespace parsyn::trainer
