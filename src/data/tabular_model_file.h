// A tabular model folder's tabular_model.json (the trainer's TabularModel writes it and builds the network from it),
// torch-free, so that the coordinator checks a tabular model at registration by the rules the trainer loads it with:
//   {"format": "parsyn-tabular", "model_type": "mlp" | "logreg", "hidden_sizes": [64], "label_column": "label",
//    "feature_names": [...], "class_names": [...], "standardizer": {"mean": [...], "std": [...]}}
// Functions here are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "data/dataset.h"

namespace parsyn::data {

struct TabularModelFile {
  std::string model_type = "mlp";     // "mlp" | "logreg"
  std::vector<int64_t> hidden_sizes;  // empty for logreg
  std::string label_column = "label";
  std::vector<std::string> feature_names;
  std::vector<std::string> class_names;
  Standardizer standardizer;
};

// The rules every tabular model meets: at least one feature, at least 2 classes, a standardizer of one mean and std
// per feature, model_type mlp or logreg, logreg without hidden layers, hidden sizes >= 1. InvalidArgument naming the
// first one broken.
Status CheckTabularModel(const TabularModelFile& model);

// Reads tabular_model.json's text. InvalidArgument (not prefixed with the file's name) for malformed JSON, a
// "format" other than "parsyn-tabular", a missing or mistyped field (named), or CheckTabularModel's rules.
StatusOr<TabularModelFile> ParseTabularModelFile(std::string_view text);

}  // namespace parsyn::data
