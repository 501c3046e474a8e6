#include "trainer/tabular_model.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/atomic_file.h"
#include "data/tabular_model_file.h"
#include "weights/safetensors.h"

namespace parsyn::trainer {
namespace {

using nlohmann::json;

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 8) out += ", ...";
  return out + "]";
}

// The rules of data/tabular_model_file.h, which the coordinator checks at registration.
Status CheckSpec(const TabularModelSpec& spec) {
  return data::CheckTabularModel({.model_type = std::string(TabularModelTypeName(spec.model_type)),
                                  .hidden_sizes = spec.hidden_sizes,
                                  .label_column = spec.label_column,
                                  .feature_names = spec.feature_names,
                                  .class_names = spec.class_names,
                                  .standardizer = spec.standardizer});
}

}  // namespace

StatusOr<TabularModelSpec> TabularSpecFor(const protocol::TrainerConfig& config, const data::TabularDataset& dataset,
                                          std::span<const int64_t> train_rows) {
  TabularModelSpec spec;
  spec.model_type = config.TabularType();
  if (spec.model_type == TabularModelType::kMlp) {
    spec.hidden_sizes.assign(config.training.hidden_sizes.begin(), config.training.hidden_sizes.end());
  }
  spec.label_column = config.training.LabelColumn();
  spec.feature_names = dataset.feature_names;
  spec.class_names = dataset.class_names;
  spec.standardizer = data::Standardizer::Fit(dataset, train_rows);
  PARSYN_RETURN_IF_ERROR(CheckSpec(spec));
  return spec;
}

TabularModel::TabularModel(TabularModelSpec spec, torch::Device device) : spec_(std::move(spec)), device_(device) {
  int64_t in = static_cast<int64_t>(spec_.feature_names.size());
  std::vector<int64_t> widths = spec_.hidden_sizes;
  widths.push_back(static_cast<int64_t>(spec_.class_names.size()));
  for (size_t i = 0; i < widths.size(); ++i) {
    layers_.emplace_back(torch::nn::LinearOptions(in, widths[i]).bias(true));
    layers_.back()->to(device_);
    names_.push_back("layers." + std::to_string(i) + ".weight");
    names_.push_back("layers." + std::to_string(i) + ".bias");
    in = widths[i];
  }
}

StatusOr<std::unique_ptr<TabularModel>> TabularModel::Create(TabularModelSpec spec, uint64_t seed,
                                                             torch::Device device) {
  PARSYN_RETURN_IF_ERROR(CheckSpec(spec));
  try {
    // Seed only the initialisation; the caller's generator state afterwards is the seed's, whatever the model size.
    torch::manual_seed(seed);
    return std::unique_ptr<TabularModel>(new TabularModel(std::move(spec), device));
  } catch (const std::exception& e) {
    return InternalError(std::string("creating tabular model: ") + e.what());
  }
}

StatusOr<std::unique_ptr<TabularModel>> TabularModel::Load(const std::filesystem::path& dir, torch::Device device) {
  const std::filesystem::path json_path = dir / kTabularModelFile;
  std::ifstream in(json_path);
  if (!in) return NotFoundError("tabular model file not found: " + json_path.string());
  std::stringstream text;
  text << in.rdbuf();
  StatusOr<data::TabularModelFile> file = data::ParseTabularModelFile(text.str());
  if (!file.ok()) return file.status().WithContext(json_path.string());
  TabularModelSpec spec{.model_type = file->model_type == "logreg" ? TabularModelType::kLogreg : TabularModelType::kMlp,
                        .hidden_sizes = std::move(file->hidden_sizes),
                        .label_column = std::move(file->label_column),
                        .feature_names = std::move(file->feature_names),
                        .class_names = std::move(file->class_names),
                        .standardizer = std::move(file->standardizer)};
  PARSYN_ASSIGN_OR_RETURN(auto model, Create(std::move(spec), 0, device));
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet weights, weights::ReadSafetensorsFile(dir / kTabularWeightsFile));
  if (Status s = model->ImportTrainable(weights); !s.ok()) return s.WithContext((dir / kTabularWeightsFile).string());
  return model;
}

Status TabularModel::Save(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError("creating " + dir.string() + ": " + ec.message());
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet weights, ExportTrainable());
  PARSYN_RETURN_IF_ERROR(weights::WriteSafetensorsFile(weights, dir / kTabularWeightsFile));
  const json j = {
      {"format", "parsyn-tabular"},
      {"model_type", TabularModelTypeName(spec_.model_type)},
      {"hidden_sizes", spec_.hidden_sizes},
      {"label_column", spec_.label_column},
      {"feature_names", spec_.feature_names},
      {"class_names", spec_.class_names},
      {"standardizer", spec_.standardizer.ToJson()},
  };
  // Atomic like the weights: a reader never sees a half-written sidecar.
  return WriteFileAtomically(dir / kTabularModelFile, j.dump(2) + "\n");
}

StepOutput TabularModel::Forward(const Batch& batch) {
  torch::Tensor x = batch.features;
  for (size_t i = 0; i < layers_.size(); ++i) {
    x = layers_[i]->forward(x);
    if (i + 1 < layers_.size()) x = torch::relu(x);
  }
  // Cross-entropy in fp32 whatever autocast chose for the matmuls, as autocast's fp32 list does for losses.
  const torch::Tensor logits = x.to(torch::kFloat32);
  StepOutput out;
  out.loss = torch::nn::functional::cross_entropy(logits, batch.labels);
  out.num_counted = batch.labels.size(0);
  out.num_correct = logits.argmax(1).eq(batch.labels).sum().item<int64_t>();
  out.num_tokens = out.num_counted;
  out.num_rows = out.num_counted;
  out.num_exact_rows = out.num_correct;
  return out;
}

std::vector<torch::Tensor> TabularModel::TrainableParameters() {
  std::vector<torch::Tensor> params;
  for (auto& layer : layers_) {
    params.push_back(layer->weight);
    params.push_back(layer->bias);
  }
  return params;
}

bool TabularModel::UsesWeightDecay(const std::string& parameter_name) const {
  return !parameter_name.ends_with(".bias");
}

std::vector<std::string> TabularModel::TrainableNames() const { return names_; }

StatusOr<weights::WeightSet> TabularModel::ExportTrainable() {
  weights::WeightSet set;
  std::vector<torch::Tensor> params = TrainableParameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor cpu = params[i].detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const auto* bytes = reinterpret_cast<const std::byte*>(cpu.data_ptr<float>());
    PARSYN_RETURN_IF_ERROR(set.Add(names_[i], weights::DType::kF32, cpu.sizes().vec(),
                                   std::span<const std::byte>(bytes, static_cast<size_t>(cpu.nbytes()))));
  }
  return set;
}

Status TabularModel::ImportTrainable(const weights::WeightSet& set) {
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet expected, ExportTrainable());
  PARSYN_RETURN_IF_ERROR(set.CheckSameLayout(expected));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params = TrainableParameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const weights::Tensor& source = set[i];
    torch::Tensor cpu = torch::empty(source.shape, torch::kFloat32);
    std::memcpy(cpu.data_ptr<float>(), source.data.data(), source.data.size());
    params[i].copy_(cpu);
  }
  return Status::Ok();
}

void TabularModel::Train(bool on) {
  for (auto& layer : layers_) layer->train(on);
}

StatusOr<TabularExamples> TabularExamples::Create(const data::TabularDataset& dataset, std::span<const int64_t> rows,
                                                  const TabularModelSpec& spec) {
  if (dataset.feature_names != spec.feature_names) {
    return InvalidArgumentError("the data's feature columns " + JoinNames(dataset.feature_names) +
                                " differ from the model's " + JoinNames(spec.feature_names));
  }
  if (dataset.class_names != spec.class_names) {
    return InvalidArgumentError("the data's classes " + JoinNames(dataset.class_names) + " differ from the model's " +
                                JoinNames(spec.class_names));
  }
  TabularExamples examples;
  examples.num_features_ = dataset.num_features();
  examples.features_.reserve(rows.size() * static_cast<size_t>(examples.num_features_));
  for (int64_t r : rows) {
    if (r < 0 || r >= dataset.num_rows()) {
      return InvalidArgumentError("row index " + std::to_string(r) + " out of range");
    }
    const auto row = dataset.Row(r);
    const size_t begin = examples.features_.size();
    examples.features_.insert(examples.features_.end(), row.begin(), row.end());
    PARSYN_RETURN_IF_ERROR(spec.standardizer.ApplyToRow(std::span<float>(examples.features_).subspan(begin)));
    examples.labels_.push_back(dataset.labels[static_cast<size_t>(r)]);
  }
  return examples;
}

Batch TabularExamples::MakeBatch(std::span<const int64_t> indices, torch::Device device) const {
  const int64_t b = static_cast<int64_t>(indices.size());
  torch::Tensor features = torch::empty({b, num_features_}, torch::kFloat32);
  torch::Tensor labels = torch::empty({b}, torch::kInt64);
  float* f = features.data_ptr<float>();
  int64_t* l = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t r = indices[static_cast<size_t>(i)];
    std::memcpy(f + i * num_features_, features_.data() + r * num_features_,
                static_cast<size_t>(num_features_) * sizeof(float));
    l[i] = labels_[static_cast<size_t>(r)];
  }
  Batch batch;
  batch.features = features.to(device);
  batch.labels = labels.to(device);
  return batch;
}

}  // namespace parsyn::trainer
