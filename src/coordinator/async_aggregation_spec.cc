#include "coordinator/async_aggregation_spec.h"

#include <nlohmann/json.hpp>

#include "protocol/field_reader.h"

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using Rule = strategy::StalenessWeighting::Rule;

constexpr int kMaxAsyncCount = 10000;

void ParseWeighting(protocol::FieldReader& r, strategy::StalenessWeighting& out, std::vector<std::string>& errors) {
  const json* value = r.Get("staleness_weighting");
  if (value == nullptr) return;
  const std::string field = r.Path("staleness_weighting");
  const std::string expected = field + " must be \"polynomial\", \"constant\" or {\"polynomial\": {\"exponent\": a}}";
  if (value->is_string()) {
    if (*value == "polynomial") {
      out = {.rule = Rule::kPolynomial};
    } else if (*value == "constant") {
      out = {.rule = Rule::kConstant};
    } else {
      r.Error(expected + ", got " + value->dump());
    }
    return;
  }
  if (!value->is_object() || value->size() != 1 || !value->contains("polynomial") ||
      !(*value)["polynomial"].is_object()) {
    r.Error(expected + ", got " + value->dump());
    return;
  }
  protocol::FieldReader p((*value)["polynomial"], field + ".polynomial.", errors);
  out = {.rule = Rule::kPolynomial};
  p.Number("exponent", out.exponent, 0, 10);
  p.RejectUnknown();
}

}  // namespace

void ParseAsyncAggregation(const json* aggregation, const json* async, AsyncAggregationSpec& spec,
                           std::vector<std::string>& errors) {
  spec = {};
  bool aggregation_valid = true;
  if (aggregation != nullptr) {
    if (*aggregation == "async") {
      spec.enabled = true;
    } else if (*aggregation != "sync") {
      aggregation_valid = false;
      errors.push_back("distributed.aggregation must be \"sync\" or \"async\", got " + aggregation->dump());
    }
  }
  if (async == nullptr) return;
  if (!spec.enabled && aggregation_valid) {
    errors.push_back(
        "distributed.async applies only with distributed.aggregation \"async\": set aggregation to \"async\" or "
        "remove async");
  }
  protocol::FieldReader r(*async, "distributed.async.", errors);
  r.Integer("buffer_size", spec.buffer_size, 1, kMaxAsyncCount);
  if (r.Get("max_concurrency") != nullptr) {
    int concurrency = 0;
    r.Integer("max_concurrency", concurrency, 1, kMaxAsyncCount);
    spec.max_concurrency = concurrency;
  }
  r.Integer("max_staleness", spec.max_staleness, 0, kMaxAsyncCount);
  ParseWeighting(r, spec.staleness_weighting, errors);
  r.Number("server_learning_rate", spec.server_learning_rate, 0, 10, /*min_exclusive=*/true);
  r.RejectUnknown();
}

void CheckAsyncAggregation(const AsyncAggregationSpec& spec, bool distributed, int max_workers, bool secure_aggregation,
                           std::vector<std::string>& errors) {
  if (!spec.enabled) return;
  if (!distributed) {
    errors.push_back(
        "distributed.aggregation \"async\" needs distributed.enabled true: a job on one worker has no versions to "
        "buffer");
    return;
  }
  const int concurrency = spec.MaxConcurrency(max_workers);
  if (spec.buffer_size > concurrency) {
    errors.push_back("distributed.async.buffer_size (" + std::to_string(spec.buffer_size) +
                     ") must be <= distributed.async.max_concurrency (" + std::to_string(concurrency) +
                     (spec.max_concurrency ? "" : ", which defaults to distributed.max_workers") +
                     "): a version needs buffer_size updates from workers training at once; lower buffer_size or "
                     "raise max_concurrency");
  }
  if (spec.max_concurrency && *spec.max_concurrency > max_workers) {
    errors.push_back("distributed.async.max_concurrency (" + std::to_string(*spec.max_concurrency) +
                     ") must be <= distributed.max_workers (" + std::to_string(max_workers) + ")");
  }
  if (secure_aggregation) {
    errors.push_back(
        "distributed.secure_aggregation cannot run with distributed.aggregation \"async\": secure aggregation's "
        "masks cancel only in the sum of one cohort that started together, and an asynchronous buffer mixes updates "
        "trained on different versions; use aggregation \"sync\" for secure aggregation");
  }
}

json AsyncAggregationToJson(const AsyncAggregationSpec& spec) {
  json out = {{"buffer_size", spec.buffer_size},
              {"max_staleness", spec.max_staleness},
              {"server_learning_rate", spec.server_learning_rate}};
  if (spec.max_concurrency) out["max_concurrency"] = *spec.max_concurrency;
  if (spec.staleness_weighting.rule == Rule::kConstant) {
    out["staleness_weighting"] = "constant";
  } else {
    out["staleness_weighting"] = {{"polynomial", {{"exponent", spec.staleness_weighting.exponent}}}};
  }
  return out;
}

}  // namespace parsyn::coordinator
