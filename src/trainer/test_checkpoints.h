// Test helpers: tiny random Llama-family checkpoints written as model folders, and small torch comparisons.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "trainer/model_folder.h"
#include "weights/weight_set.h"

namespace parsyn::trainer::testing {

// A fresh empty directory under the system temp dir, unique to this test.
std::filesystem::path FreshTempDir(const std::string& name);

// A small config: vocab 50, hidden 32, 2 layers, 4 heads of 8, intermediate 48.
LlamaConfig TinyConfig(const std::string& model_type = "llama");

// Every parameter random (linear weights N(0, 0.1^2), norms 1 + N(0, 0.1^2), biases N(0, 0.1^2)), so norms and
// biases matter to the output. `num_shards` > 1 writes model-0000k-of-0000n.safetensors and the index.
void WriteRandomCheckpoint(const std::filesystem::path& dir, const LlamaConfig& config, uint64_t seed,
                           weights::DType dtype = weights::DType::kF32, int num_shards = 1);

// Max |a - b| over all elements.
double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace parsyn::trainer::testing
