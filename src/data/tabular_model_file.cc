#include "data/tabular_model_file.h"

#include <nlohmann/json.hpp>

namespace parsyn::data {

using nlohmann::json;

Status CheckTabularModel(const TabularModelFile& model) {
  if (model.model_type != "mlp" && model.model_type != "logreg") {
    return InvalidArgumentError("model_type '" + model.model_type + "' is not supported (mlp, logreg)");
  }
  if (model.feature_names.empty()) return InvalidArgumentError("tabular model has no feature columns");
  if (model.class_names.size() < 2) {
    return InvalidArgumentError("a classifier needs at least 2 classes in column '" + model.label_column + "', got " +
                                std::to_string(model.class_names.size()));
  }
  if (model.standardizer.mean.size() != model.feature_names.size() ||
      model.standardizer.std.size() != model.feature_names.size()) {
    return InvalidArgumentError("standardizer has " + std::to_string(model.standardizer.mean.size()) +
                                " features, the model " + std::to_string(model.feature_names.size()));
  }
  if (model.model_type == "logreg" && !model.hidden_sizes.empty()) {
    return InvalidArgumentError("logreg has no hidden layers; hidden_sizes must be empty");
  }
  for (int64_t width : model.hidden_sizes) {
    if (width < 1) return InvalidArgumentError("hidden sizes must be >= 1");
  }
  return Status::Ok();
}

StatusOr<TabularModelFile> ParseTabularModelFile(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgumentError("is not a JSON object");
  if (j.value("format", json()) != "parsyn-tabular") {
    return InvalidArgumentError("\"format\" must be \"parsyn-tabular\"");
  }
  TabularModelFile model;
  // The field being read, for the message of a missing or mistyped one.
  const char* field = "";
  try {
    field = "model_type";
    model.model_type = j.at(field).get<std::string>();
    field = "hidden_sizes";
    model.hidden_sizes = j.at(field).get<std::vector<int64_t>>();
    field = "label_column";
    model.label_column = j.at(field).get<std::string>();
    field = "feature_names";
    model.feature_names = j.at(field).get<std::vector<std::string>>();
    field = "class_names";
    model.class_names = j.at(field).get<std::vector<std::string>>();
    field = "standardizer";
    PARSYN_ASSIGN_OR_RETURN(model.standardizer, Standardizer::FromJson(j.at(field)));
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("'") + field + "': " + e.what());
  }
  PARSYN_RETURN_IF_ERROR(CheckTabularModel(model));
  return model;
}

}  // namespace parsyn::data
