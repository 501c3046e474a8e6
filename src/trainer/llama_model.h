// A Llama-family causal language model (llama, qwen2, mistral) in libtorch, with optional LoRA adapters.
//
// The network, for input ids x (B, T) and attention mask m (B, T) (1 = real token):
//   h = embed_tokens[x]
//   per layer:  h += o_proj(Attention(RoPE(q_proj(n)), RoPE(k_proj(n)), v_proj(n)))   n = RMSNorm(h) * input_layernorm
//               h += down_proj(silu(gate_proj(n)) * up_proj(n))                      n = RMSNorm(h) *
//               post_attention_layernorm
//   logits = lm_head(RMSNorm(h) * norm)          (lm_head = embed_tokens when tie_word_embeddings)
// RMSNorm(h) = h / sqrt(mean(h^2) + rms_norm_eps), computed in fp32. Grouped-query attention: query head j uses
// key/value head j / (num_attention_heads / num_key_value_heads). A token's rotary position is the number of real
// tokens before it in its row (so left and right padding give real tokens the same positions). A query sees the
// real keys at or before it (within the sliding window, if any); a padding query sees only itself, so every row of
// the softmax is finite. Logits at padding positions are not meaningful.
//
// LoRA on a projection W: y = W x + (alpha / r) * B (A dropout(x)),  A: (r, in), B: (out, r).
//
// A LlamaModel is used from one thread at a time.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "trainer/model_folder.h"
#include "weights/weight_set.h"

namespace parsyn::trainer {

struct ModelOptions {
  // Dtype of the stored (master) parameters. Under LoRA the frozen base may be stored in the compute dtype to save
  // the per-forward cast and half the memory; adapters are always fp32.
  torch::Dtype param_dtype = torch::kFloat32;
  // Dtype the forward runs in. kBFloat16 (or kHalf): weights are cast on the fly (gradients flow back to the fp32
  // masters), activations are in that dtype, while RMSNorm statistics, softmax and logits stay fp32.
  torch::Dtype compute_dtype = torch::kFloat32;
  torch::Device device = torch::kCPU;
};

struct LoraSettings {
  int64_t r = 8;
  double alpha = 16;
  double dropout = 0;
  // Any of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or "all-linear".
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
};

class LlamaModel {
 public:
  // Builds the model from a folder's tensors (converted to options.param_dtype, moved to options.device).
  // InvalidArgument naming the first tensor that is missing, has the wrong shape or a non-float dtype, or is not
  // part of the network (checkpoints' rotary_emb.inv_freq buffers, and lm_head.weight of a tied model, are skipped).
  static StatusOr<std::unique_ptr<LlamaModel>> FromFolder(const ModelFolder& folder, const ModelOptions& options = {});
  // ReadModelFolder + FromFolder.
  static StatusOr<std::unique_ptr<LlamaModel>> Load(const std::filesystem::path& dir, const ModelOptions& options = {});
  // A model whose parameters are drawn as transformers initialises them: linear and embedding weights
  // N(0, initializer_range = 0.02), norms 1, biases 0; deterministic for a seed.
  static StatusOr<std::unique_ptr<LlamaModel>> RandomInit(const LlamaConfig& config, uint64_t seed,
                                                          const ModelOptions& options = {});

  ~LlamaModel();

  // input_ids (B, T) int64; attention_mask (B, T) of 0/1, or undefined for all ones. Returns logits (B, T, V) fp32.
  // Throws c10::Error on malformed inputs (wrong rank, ids out of range); the caller catches at its edge.
  torch::Tensor Forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask);

  const LlamaConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }

  // Base parameters with Hugging Face names, in LlamaParameterSpecs order.
  const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters() const { return params_; }
  // Whether the base parameters take gradients (on for full fine-tuning; off under LoRA).
  void SetBaseTrainable(bool trainable);
  // Enables LoRA dropout.
  void Train(bool on) { training_ = on; }

  // All base parameters as a WeightSet with Hugging Face names, converted to `dtype` (a float dtype).
  StatusOr<weights::WeightSet> ExportWeights(weights::DType dtype) const;
  // Replaces the base parameters. InvalidArgument if `set` lacks a parameter, has another, or a shape differs.
  Status ImportWeights(const weights::WeightSet& set);

  // --- LoRA -----------------------------------------------------------------------------------------------------
  // Adds adapters with PEFT's initialisation from weights::InitialLoraAdapters(seed) (A uniform, B zero), so a
  // coordinator creating round-1 adapters for the same seed gets identical values. Freezes the base parameters.
  // FailedPrecondition if adapters are already attached; InvalidArgument for bad settings.
  Status AttachLora(const LoraSettings& settings, uint64_t seed);
  bool has_lora() const { return lora_.has_value(); }
  const LoraSettings& lora_settings() const { return *lora_; }
  // Adapter matrices with PEFT names, in weights::LoraLayout order (empty without LoRA).
  std::vector<std::pair<std::string, torch::Tensor>> lora_parameters() const;
  // FailedPrecondition without LoRA.
  StatusOr<weights::WeightSet> ExportLora(weights::DType dtype) const;
  // Replaces the adapters' values. Tensors may be any float dtype (converted); names and shapes must be those of the
  // layout, else InvalidArgument naming the tensor. FailedPrecondition without LoRA.
  Status ImportLora(const weights::WeightSet& set);
  // W += (alpha / r) * B A for every adapted projection (computed in fp32), then drops the adapters.
  // FailedPrecondition without LoRA.
  Status MergeLora();

 private:
  struct Projection;
  struct Layer;
  LlamaModel(LlamaConfig config, ModelOptions options);
  void BuildLayers();
  torch::Tensor Cast(const torch::Tensor& t) const;
  torch::Tensor Linear(const Projection& p, const torch::Tensor& x) const;
  torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight) const;
  std::pair<torch::Tensor, torch::Tensor> RopeTables(const torch::Tensor& positions) const;
  Projection& ProjectionFor(int64_t layer, const std::string& module);
  const Projection& ProjectionFor(int64_t layer, const std::string& module) const;

  LlamaConfig config_;
  ModelOptions options_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<Layer> layers_;
  torch::Tensor embed_tokens_, final_norm_, lm_head_;
  torch::Tensor inv_freq_;  // (head_dim / 2) fp32, rope_scaling applied
  std::optional<LoraSettings> lora_;
  std::vector<std::string> lora_targets_;  // normalised, in layout order
  bool training_ = false;
};

}  // namespace parsyn::trainer
