#include "coordinator/job_spec.h"
#include "coordinator/strategy_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// The request body of docs/product-spec.md, verbatim.
json SpecExample() {
  return json::parse(R"({
    "name": "distributed-llama-finetune",
    "dataset_id": 42,
    "model_id": 7,
    "config": {
      "epochs": 3, "batch_size": 4, "learning_rate": 2e-4, "mixed_precision": "bf16",
      "use_peft": true, "lora_r": 16, "lora_alpha": 32
    },
    "distributed": {
      "enabled": true, "strategy": "federated_averaging", "num_rounds": 10, "steps_per_round": 500,
      "min_workers": 2, "max_workers": 5, "aggregation_timeout": 600, "fault_tolerance": 1
    },
    "worker_selection": {"mode": "mixed", "worker_ids": [1, 3], "parsyn_worker_ids": [5]}
  })");
}

TEST(JobSpecTest, ParsesTheSpecExample) {
  StatusOr<JobSpec> spec = ParseJobSpec(SpecExample().dump());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->name, "distributed-llama-finetune");
  EXPECT_EQ(spec->dataset_id, 42);
  EXPECT_EQ(spec->model_id, 7);
  EXPECT_EQ(spec->config.epochs, 3);
  EXPECT_EQ(spec->config.batch_size, 4);
  EXPECT_DOUBLE_EQ(spec->config.learning_rate, 2e-4);
  EXPECT_EQ(spec->config.mixed_precision, MixedPrecision::kBf16);
  EXPECT_TRUE(spec->config.use_peft);
  EXPECT_EQ(spec->config.lora_r, 16);
  EXPECT_DOUBLE_EQ(spec->config.lora_alpha, 32);
  // Defaults of what the body leaves out.
  EXPECT_DOUBLE_EQ(spec->config.lora_dropout, 0.05);
  EXPECT_EQ(spec->config.lora_target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(spec->config.lr_scheduler, LrScheduler::kLinear);
  EXPECT_EQ(spec->config.seed, 42u);
  EXPECT_DOUBLE_EQ(spec->config.validation_fraction, 0.1);

  const DistributedConfig& d = spec->distributed;
  EXPECT_TRUE(d.enabled);
  EXPECT_EQ(d.strategy, AggregationStrategy::kFederatedAveraging);
  EXPECT_EQ(d.num_rounds, 10);
  EXPECT_EQ(d.steps_per_round, 500);
  EXPECT_EQ(d.min_workers, 2);
  EXPECT_EQ(d.max_workers, 5);
  EXPECT_EQ(d.aggregation_timeout_ms, 600'000);
  EXPECT_EQ(d.fault_tolerance, 1);
  EXPECT_EQ(spec->worker_selection.mode, WorkerSelectionMode::kMixed);
  EXPECT_EQ(spec->SelectedWorkers(), (std::vector<int64_t>{1, 3, 5}));
}

TEST(JobSpecTest, NormalisedJsonParsesBackToTheSameSpec) {
  for (const json& body : {SpecExample(), json{{"name", "solo"}, {"dataset_id", 1}, {"model_id", 2}}}) {
    StatusOr<JobSpec> spec = ParseJobSpecJson(body);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const json normalised = JobSpecToJson(*spec);
    StatusOr<JobSpec> again = ParseJobSpec(JobSpecToJsonString(*spec));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(*again, *spec);
    EXPECT_EQ(JobSpecToJson(*again), normalised);
  }
}

TEST(JobSpecTest, NormalisedJsonHasEveryDefault) {
  StatusOr<JobSpec> spec = ParseJobSpec(R"({"name": "n", "dataset_id": 1, "model_id": 2})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const json expected = json::parse(R"({
    "name": "n", "dataset_id": 1, "model_id": 2,
    "config": {
      "epochs": 1, "batch_size": 8, "learning_rate": 0.0002, "mixed_precision": "no", "use_peft": true,
      "lora_r": 16, "lora_alpha": 32.0, "lora_dropout": 0.05, "lora_target_modules": ["q_proj", "v_proj"],
      "max_seq_len": 512, "weight_decay": 0.0, "warmup_steps": 0, "lr_scheduler": "linear",
      "gradient_accumulation_steps": 1, "max_grad_norm": 1.0, "seed": 42, "validation_fraction": 0.1,
      "label_column": "", "hidden_sizes": [], "trainer": "builtin"
    },
    "distributed": {
      "enabled": false, "strategy": "federated_averaging", "num_rounds": 1, "steps_per_round": 0,
      "min_workers": 1, "max_workers": 1, "aggregation_timeout": 600, "fault_tolerance": 3,
      "join_window": 5, "strategy_options": {}
    },
    "worker_selection": {"mode": "auto", "worker_ids": [], "parsyn_worker_ids": []},
    "data": {"source": "platform"}
  })");
  EXPECT_EQ(JobSpecToJson(*spec), expected) << JobSpecToJson(*spec).dump(2);
}

// The job form shows DistributedDefaultsJson as its placeholders (training_defaults.js): each is what a distributed
// job that leaves the field out gets.
TEST(JobSpecTest, TheFormsDistributedDefaultsAreWhatADistributedJobLeavingThemOutGets) {
  StatusOr<JobSpec> spec = ParseJobSpec(
      R"({"name": "n", "dataset_id": 1, "model_id": 2, "distributed": {"enabled": true, "partition": {"method": "iid"}}})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const json normalised = JobSpecToJson(*spec)["distributed"];
  const json shown = DistributedDefaultsJson();
  EXPECT_EQ(shown, json::parse(R"({
    "strategy": "federated_averaging", "num_rounds": 10, "steps_per_round": 500, "min_workers": 2,
    "aggregation_timeout": 600, "fault_tolerance": 3, "join_window": 5,
    "partition": {"method": "iid", "alpha": 0.5, "classes_per_worker": 2}
  })"))
      << shown.dump(2);
  for (const char* key : {"strategy", "num_rounds", "steps_per_round", "min_workers", "aggregation_timeout",
                          "fault_tolerance", "join_window"}) {
    EXPECT_EQ(shown[key], normalised[key]) << key;
  }
  EXPECT_EQ(shown["partition"]["method"], PartitionMethodName(spec->distributed.partition.method));
  for (const char* method : {"dirichlet", "shards_per_worker"}) {
    StatusOr<JobSpec> partitioned = ParseJobSpec(R"({"name": "n", "dataset_id": 1, "model_id": 2, "distributed": )"
                                                 R"({"enabled": true, "partition": {"method": ")" +
                                                 std::string(method) + R"(", "label": "y"}}})");
    ASSERT_TRUE(partitioned.ok()) << partitioned.status().ToString();
    const json given = JobSpecToJson(*partitioned)["distributed"]["partition"];
    const char* setting = std::string_view(method) == "dirichlet" ? "alpha" : "classes_per_worker";
    EXPECT_EQ(shown["partition"][setting], given[setting]) << method;
  }
}

struct GoodCase {
  std::string label;
  std::function<void(json&)> edit;
  std::function<void(const JobSpec&)> check;
};

TEST(JobSpecTest, GoodBodies) {
  const std::vector<GoodCase> cases = {
      {"distributed absent: one worker, one round", [](json& b) { b.erase("distributed"); },
       [](const JobSpec& s) {
         EXPECT_FALSE(s.distributed.enabled);
         EXPECT_EQ(s.distributed.num_rounds, 1);
         EXPECT_EQ(s.distributed.min_workers, 1);
         EXPECT_EQ(s.distributed.max_workers, 1);
         EXPECT_EQ(s.distributed.steps_per_round, 0);
       }},
      {"enabled false: one worker, one round", [](json& b) { b["distributed"]["enabled"] = false; },
       [](const JobSpec& s) {
         EXPECT_FALSE(s.distributed.enabled);
         EXPECT_EQ(s.distributed.num_rounds, 1);
         EXPECT_EQ(s.distributed.max_workers, 1);
       }},
      {"fedadam with its defaults", [](json& b) { b["distributed"]["strategy"] = "fedadam"; },
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.strategy, AggregationStrategy::kFedAdam);
         EXPECT_EQ(s.distributed.strategy_options, strategy::DefaultStrategyOptions(strategy::StrategyKind::kFedAdam));
         EXPECT_EQ(s.distributed.strategy_options.server_learning_rate, 0.1);
         EXPECT_EQ(s.distributed.strategy_options.tau, 1e-9);
       }},
      {"fedprox's mu, sampled by fraction",
       [](json& b) {
         b["distributed"]["strategy"] = "fedprox";
         b["distributed"]["strategy_options"] = {{"mu", 0.5}, {"sample_fraction", 0.4}};
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.strategy, AggregationStrategy::kFedProx);
         EXPECT_EQ(s.distributed.strategy_options.mu, 0.5);
         EXPECT_EQ(s.distributed.strategy_options.sampling.fraction, 0.4);
         EXPECT_FALSE(s.distributed.strategy_options.sampling.count);
       }},
      {"fedavgm and fedyogi options, sample_count, null options",
       [](json& b) {
         b["distributed"]["strategy"] = "fedyogi";
         b["distributed"]["strategy_options"] = {
             {"server_learning_rate", 0.05}, {"beta2", 0.9}, {"sample_count", 3}, {"tau", nullptr}, {"mu", nullptr}};
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.strategy_options.server_learning_rate, 0.05);
         EXPECT_EQ(s.distributed.strategy_options.beta1, 0.9);
         EXPECT_EQ(s.distributed.strategy_options.beta2, 0.9);
         EXPECT_EQ(s.distributed.strategy_options.tau, 1e-3);  // null: the default
         EXPECT_EQ(s.distributed.strategy_options.sampling.count, 3);
       }},
      {"distributed defaults",
       [](json& b) {
         b["distributed"] = {{"enabled", true}};
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.num_rounds, 10);
         EXPECT_EQ(s.distributed.steps_per_round, 500);
         EXPECT_EQ(s.distributed.min_workers, 2);
         EXPECT_EQ(s.distributed.max_workers, 3);  // max(min_workers, 3 listed workers)
         EXPECT_EQ(s.distributed.aggregation_timeout_ms, 600'000);
         EXPECT_EQ(s.distributed.fault_tolerance, 3);
       }},
      {"max_workers defaults to min_workers in auto mode",
       [](json& b) {
         b["distributed"] = {{"enabled", true}, {"min_workers", 4}};
         b.erase("worker_selection");
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.worker_selection.mode, WorkerSelectionMode::kAuto);
         EXPECT_EQ(s.distributed.max_workers, 4);
       }},
      {"10,000 workers",
       [](json& b) {
         b["worker_selection"] = {{"worker_ids", json::array()}};
         for (int id = 1; id <= 10'000; ++id) b["worker_selection"]["worker_ids"].push_back(id);
         b["distributed"]["min_workers"] = 10'000;
         b["distributed"]["max_workers"] = 10'000;
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.SelectedWorkers().size(), 10'000u);
         EXPECT_EQ(s.distributed.min_workers, 10'000);
         EXPECT_EQ(s.distributed.max_workers, 10'000);
       }},
      {"fractional timeout in seconds", [](json& b) { b["distributed"]["aggregation_timeout"] = 2.5; },
       [](const JobSpec& s) { EXPECT_EQ(s.distributed.aggregation_timeout_ms, 2500); }},
      {"null means default", [](json& b) { b["config"]["epochs"] = nullptr; },
       [](const JobSpec& s) { EXPECT_EQ(s.config.epochs, 1); }},
      {"mode inferred from the lists",
       [](json& b) {
         b["worker_selection"] = {{"worker_ids", {4, 2}}};
         b["distributed"]["min_workers"] = 2;
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.worker_selection.mode, WorkerSelectionMode::kOwn);
         EXPECT_EQ(s.SelectedWorkers(), (std::vector<int64_t>{4, 2}));
       }},
      {"early stopping, min_delta defaulted",
       [](json& b) {
         b["distributed"]["early_stopping"] = {{"patience", 3}};
       },
       [](const JobSpec& s) {
         ASSERT_TRUE(s.distributed.early_stopping.has_value());
         EXPECT_EQ(s.distributed.early_stopping->patience, 3);
         EXPECT_EQ(s.distributed.early_stopping->min_delta, 0.0);
         EXPECT_EQ(JobSpecToJson(s)["distributed"]["early_stopping"],
                   json::parse(R"({"patience": 3, "min_delta": 0.0})"));
         EXPECT_EQ(*ParseJobSpecJson(JobSpecToJson(s)), s);
       }},
      {"early stopping null is off", [](json& b) { b["distributed"]["early_stopping"] = nullptr; },
       [](const JobSpec& s) {
         EXPECT_FALSE(s.distributed.early_stopping.has_value());
         EXPECT_FALSE(JobSpecToJson(s)["distributed"].contains("early_stopping"));
       }},
      {"tabular fields",
       [](json& b) {
         b["config"]["label_column"] = "label";
         b["config"]["hidden_sizes"] = {64, 32};
         b["config"]["use_peft"] = false;
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.config.label_column, "label");
         EXPECT_EQ(s.config.hidden_sizes, (std::vector<int>{64, 32}));
         EXPECT_FALSE(s.config.use_peft);
       }},
      {"trainer fields",
       [](json& b) {
         json& c = b["config"];
         c["lora_dropout"] = 0;
         c["lora_target_modules"] = {"q_proj", "k_proj", "v_proj", "o_proj"};
         c["max_seq_len"] = 1024;
         c["weight_decay"] = 0.01;
         c["warmup_steps"] = 100;
         c["lr_scheduler"] = "cosine";
         c["gradient_accumulation_steps"] = 4;
         c["max_grad_norm"] = 0;
         c["seed"] = 9007199254740992;  // 2^53
         c["validation_fraction"] = 0;
         c["mixed_precision"] = "fp16";
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.config.lora_target_modules.size(), 4u);
         EXPECT_EQ(s.config.max_seq_len, 1024);
         EXPECT_EQ(s.config.lr_scheduler, LrScheduler::kCosine);
         EXPECT_EQ(s.config.gradient_accumulation_steps, 4);
         EXPECT_EQ(s.config.seed, 9007199254740992u);
         EXPECT_EQ(s.config.mixed_precision, MixedPrecision::kFp16);
       }},
  };
  const std::vector<GoodCase> partition_cases = {
      {"partition absent: iid", [](json&) {},
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.partition, DataPartition{});
         EXPECT_FALSE(JobSpecToJson(s)["distributed"].contains("partition"));
       }},
      {"partition dirichlet with defaults",
       [](json& b) {
         b["distributed"]["partition"] = {{"method", "dirichlet"}};
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.partition.method, PartitionMethod::kDirichlet);
         EXPECT_EQ(s.distributed.partition.alpha, 0.5);
         EXPECT_EQ(JobSpecToJson(s)["distributed"]["partition"], json({{"method", "dirichlet"}, {"alpha", 0.5}}));
       }},
      {"partition shards_per_worker with a label",
       [](json& b) {
         b["distributed"]["partition"] = {{"method", "shards_per_worker"}, {"classes_per_worker", 3}, {"label", "y"}};
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.partition.method, PartitionMethod::kShardsPerWorker);
         EXPECT_EQ(s.distributed.partition.classes_per_worker, 3);
         EXPECT_EQ(s.distributed.partition.label, "y");
         EXPECT_EQ(PartitionMethodName(s.distributed.partition.method), "shards_per_worker");
       }},
      {"partition iid with a label (for the histogram)",
       [](json& b) {
         b["distributed"]["partition"] = {{"method", "iid"}, {"label", "topic"}};
       },
       [](const JobSpec& s) { EXPECT_EQ(s.distributed.partition.label, "topic"); }},
  };
  const std::vector<GoodCase> compression_cases = {
      {"compression absent: none, omitted from the normalised form", [](json&) {},
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.compression, protocol::UpdateCompression{});
         EXPECT_FALSE(JobSpecToJson(s)["distributed"].contains("compression"));
       }},
      {"compression int8 + delta + zstd, normalised with every field",
       [](json& b) {
         b["distributed"]["compression"] = {{"update", "int8"}, {"delta", true}, {"zstd_level", 3}};
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.compression.update, "int8");
         EXPECT_TRUE(s.distributed.compression.delta);
         EXPECT_EQ(s.distributed.compression.zstd_level, 3);
         EXPECT_EQ(JobSpecToJson(s)["distributed"]["compression"], json({{"update", "int8"},
                                                                         {"delta", true},
                                                                         {"zstd_level", 3},
                                                                         {"error_feedback", false},
                                                                         {"global", "none"}}));
       }},
      {"the global as int4 deltas, with the update plain",
       [](json& b) {
         b["distributed"]["compression"] = {{"global", "delta_int4"}};
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.compression.global, "delta_int4");
         EXPECT_EQ(s.distributed.compression.update, "none");
         EXPECT_EQ(JobSpecToJson(s)["distributed"]["compression"]["global"], "delta_int4");
       }},
      {"compression int4 + error feedback",
       [](json& b) {
         b["distributed"]["compression"] = {{"update", "int4"}, {"delta", true}, {"error_feedback", true}};
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.compression.update, "int4");
         EXPECT_TRUE(s.distributed.compression.error_feedback);
       }},
      {"compression none with zstd only",
       [](json& b) {
         b["distributed"]["compression"] = {{"update", "none"}, {"zstd_level", 19}};
       },
       [](const JobSpec& s) {
         EXPECT_EQ(s.distributed.compression.zstd_level, 19);
         EXPECT_EQ(JobSpecToJson(s)["distributed"]["compression"]["update"], "none");
       }},
      {"compression of a one-worker job: ignored (plain)",
       [](json& b) {
         b["distributed"]["enabled"] = false;
         b["distributed"]["compression"] = {{"update", "bf16"}};
       },
       [](const JobSpec& s) { EXPECT_EQ(s.distributed.compression, protocol::UpdateCompression{}); }},
  };
  std::vector<GoodCase> all = cases;
  all.insert(all.end(), partition_cases.begin(), partition_cases.end());
  all.insert(all.end(), compression_cases.begin(), compression_cases.end());
  for (const GoodCase& c : all) {
    json body = SpecExample();
    c.edit(body);
    StatusOr<JobSpec> spec = ParseJobSpecJson(body);
    ASSERT_TRUE(spec.ok()) << c.label << ": " << spec.status().ToString();
    c.check(*spec);
    StatusOr<JobSpec> again = ParseJobSpecJson(JobSpecToJson(*spec));
    ASSERT_TRUE(again.ok()) << c.label << " (round trip): " << again.status().ToString();
    EXPECT_EQ(*again, *spec) << c.label;
  }
}

struct BadCase {
  std::function<void(json&)> edit;
  std::string message;  // the whole message: exactly the problems listed
};

TEST(JobSpecTest, BadBodiesNameTheFieldAndTheReason) {
  const std::vector<BadCase> cases = {
      {[](json& b) { b["config"]["lerning_rate"] = 0.1; }, "unknown field config.lerning_rate"},
      {[](json& b) { b["colour"] = "red"; }, "unknown field colour"},
      {[](json& b) { b["distributed"]["rounds"] = 3; }, "unknown field distributed.rounds"},
      {[](json& b) { b["worker_selection"]["ids"] = {1}; }, "unknown field worker_selection.ids"},
      {[](json& b) { b.erase("name"); }, "name is required"},
      {[](json& b) { b["dataset_id"] = nullptr; }, "dataset_id is required"},
      {[](json& b) { b.erase("model_id"); }, "model_id is required"},
      {[](json& b) { b["name"] = ""; }, "name must be 1..128 bytes long, got 0"},
      {[](json& b) { b["name"] = std::string(129, 'x'); }, "name must be 1..128 bytes long, got 129"},
      {[](json& b) { b["name"] = "a\nb"; }, "name must not contain control characters"},
      {[](json& b) { b["name"] = 5; }, "name must be a string, got number"},
      {[](json& b) { b["dataset_id"] = "42"; }, "dataset_id must be an integer, got string"},
      {[](json& b) { b["dataset_id"] = 0; }, "dataset_id (0) must be between 1 and 9223372036854775807"},
      {[](json& b) { b["model_id"] = 7.5; }, "model_id must be an integer, got 7.5"},
      {[](json& b) { b["model_id"] = 18446744073709551615ULL; },
       "model_id (18446744073709551615) must be between 1 and 9223372036854775807"},
      {[](json& b) { b["config"] = json::array(); }, "config must be an object, got array"},
      {[](json& b) { b["config"]["epochs"] = 0; }, "config.epochs (0) must be between 1 and 1000"},
      {[](json& b) { b["config"]["epochs"] = true; }, "config.epochs must be an integer, got boolean"},
      {[](json& b) { b["config"]["batch_size"] = -1; }, "config.batch_size (-1) must be between 1 and 65536"},
      {[](json& b) { b["config"]["learning_rate"] = 0; }, "config.learning_rate (0) must be > 0 and <= 10"},
      {[](json& b) { b["config"]["learning_rate"] = "fast"; }, "config.learning_rate must be a number, got string"},
      {[](json& b) { b["config"]["mixed_precision"] = "fp8"; },
       "config.mixed_precision must be one of \"bf16\", \"fp16\", \"no\", got \"fp8\""},
      {[](json& b) { b["config"]["mixed_precision"] = false; },
       "config.mixed_precision must be one of \"bf16\", \"fp16\", \"no\", got boolean"},
      {[](json& b) { b["config"]["use_peft"] = "yes"; }, "config.use_peft must be a boolean, got string"},
      {[](json& b) { b["config"]["lora_r"] = 0; }, "config.lora_r (0) must be between 1 and 1024"},
      {[](json& b) { b["config"]["lora_alpha"] = -1; }, "config.lora_alpha (-1) must be > 0 and <= 65536"},
      {[](json& b) { b["config"]["lora_dropout"] = 1; }, "config.lora_dropout (1) must be >= 0 and < 1"},
      {[](json& b) { b["config"]["lora_target_modules"] = json::array(); },
       "config.lora_target_modules must be an array of 1..64 module names"},
      {[](json& b) {
         b["config"]["lora_target_modules"] = {"q_proj", "../x"};
       },
       "config.lora_target_modules[1] (\"../x\") must be 1..128 characters of [A-Za-z0-9_.]"},
      {[](json& b) {
         b["config"]["lora_target_modules"] = {"q_proj", "q_proj"};
       },
       "config.lora_target_modules lists \"q_proj\" twice"},
      {[](json& b) { b["config"]["max_seq_len"] = 4; }, "config.max_seq_len (4) must be between 8 and 131072"},
      {[](json& b) { b["config"]["weight_decay"] = -0.1; }, "config.weight_decay (-0.1) must be >= 0 and <= 10"},
      {[](json& b) { b["config"]["warmup_steps"] = -1; }, "config.warmup_steps (-1) must be between 0 and 1000000000"},
      {[](json& b) { b["config"]["lr_scheduler"] = "step"; },
       "config.lr_scheduler must be one of \"constant\", \"linear\", \"cosine\", got \"step\""},
      {[](json& b) { b["config"]["gradient_accumulation_steps"] = 0; },
       "config.gradient_accumulation_steps (0) must be between 1 and 1024"},
      {[](json& b) { b["config"]["max_grad_norm"] = -1; }, "config.max_grad_norm (-1) must be >= 0 and <= 1e+06"},
      {[](json& b) { b["config"]["seed"] = -3; }, "config.seed (-3) must be between 0 and 9007199254740992"},
      {[](json& b) { b["config"]["validation_fraction"] = 0.9; },
       "config.validation_fraction (0.9) must be >= 0 and <= 0.5"},
      {[](json& b) { b["config"]["label_column"] = 3; }, "config.label_column must be a string, got number"},
      {[](json& b) {
         b["config"]["hidden_sizes"] = {64, 0};
       },
       "config.hidden_sizes[1] (0) must be between 1 and 65536"},
      {[](json& b) { b["config"]["hidden_sizes"] = "64"; },
       "config.hidden_sizes must be an array of integers, got string"},
      {[](json& b) { b["distributed"] = true; }, "distributed must be an object, got boolean"},
      {[](json& b) { b["distributed"]["enabled"] = 1; }, "distributed.enabled must be a boolean, got number"},
      {[](json& b) { b["distributed"]["strategy"] = "fedsgd"; },
       "distributed.strategy must be one of \"federated_averaging\", \"fedprox\", \"fedavgm\", \"fedadam\", "
       "\"fedyogi\", \"fedadagrad\", \"median\", \"trimmed_mean\", \"krum\", \"multi_krum\", \"dp_fedavg\", got "
       "\"fedsgd\""},
      {[](json& b) {
         b["distributed"]["strategy"] = "fedadam";
         b["distributed"]["strategy_options"] = {{"mu", 0.1}};
       },
       "distributed.strategy_options.mu: fedadam does not take mu; it takes server_learning_rate, beta1, beta2, tau, "
       "sample_fraction, sample_count"},
      {[](json& b) {
         b["distributed"]["strategy_options"] = {{"beta1", 0.9}};
       },
       "distributed.strategy_options.beta1: federated_averaging does not take beta1; it takes sample_fraction, "
       "sample_count"},
      {[](json& b) {
         b["distributed"]["strategy"] = "fedadam";
         b["distributed"]["strategy_options"] = {{"beta1", 1}, {"server_learning_rate", 0}};
       },
       "distributed.strategy_options.server_learning_rate (0) must be > 0 and <= 1000; "
       "distributed.strategy_options.beta1 (1) must be >= 0 and < 1"},
      {[](json& b) {
         b["distributed"]["strategy"] = "fedyogi";
         b["distributed"]["strategy_options"] = {{"tau", 0}};
       },
       "distributed.strategy_options.tau (0) must be > 0 and <= 10"},
      {[](json& b) {
         b["distributed"]["strategy"] = "fedprox";
         b["distributed"]["strategy_options"] = {{"mu", -1}, {"eta", 1}};
       },
       "distributed.strategy_options.mu (-1) must be >= 0 and <= 10000; unknown field "
       "distributed.strategy_options.eta"},
      {[](json& b) {
         b["distributed"]["strategy_options"] = {{"sample_fraction", 0.5}, {"sample_count", 2}};
       },
       "distributed.strategy_options.sample_count: give sample_fraction or sample_count, not both (each chooses how "
       "many workers train per round)"},
      {[](json& b) {
         b["distributed"]["strategy_options"] = {{"sample_fraction", 0}};
       },
       "distributed.strategy_options.sample_fraction (0) must be > 0 and <= 1"},
      {[](json& b) {
         b["distributed"]["strategy_options"] = {{"sample_count", 1}};
       },
       "distributed.strategy_options.sample_count (1) must be between distributed.min_workers (2) and "
       "distributed.max_workers (5)"},
      {[](json& b) { b["distributed"]["strategy_options"] = 3; },
       "distributed.strategy_options must be an object, got number"},
      {[](json& b) {
         b["distributed"]["strategy"] = "krum";
         b["distributed"]["strategy_options"] = {{"f", 1}};
       },
       "distributed.min_workers (2) must be >= 2f + 3 = 5 for krum with "
       "distributed.strategy_options.f 1: Krum scores each update against its n - f - 2 nearest others"},
      {[](json& b) { b["distributed"]["strategy"] = "dp_fedavg"; },
       "distributed.strategy_options.clip_norm is required for dp_fedavg: the L2 bound each update is clipped to (the "
       "noise is noise_multiplier * clip_norm), e.g. 1.0"},
      {[](json& b) { b["distributed"]["num_rounds"] = 0; }, "distributed.num_rounds (0) must be between 1 and 10000"},
      {[](json& b) { b["distributed"]["steps_per_round"] = -5; },
       "distributed.steps_per_round (-5) must be between 0 and 10000000"},
      {[](json& b) { b["distributed"]["min_workers"] = 0; }, "distributed.min_workers (0) must be between 1 and 10000"},
      {[](json& b) { b["distributed"]["max_workers"] = 10'001; },
       "distributed.max_workers (10001) must be between 1 and 10000"},
      {[](json& b) {
         b["worker_selection"] = {{"worker_ids", json::array()}};
         for (int id = 1; id <= 10'001; ++id) b["worker_selection"]["worker_ids"].push_back(id);
       },
       "worker_selection.worker_ids has 10001 entries, at most 10000 are allowed"},
      {[](json& b) { b["distributed"]["early_stopping"] = json::object(); },
       "distributed.early_stopping.patience is required"},
      {[](json& b) {
         b["distributed"]["early_stopping"] = {{"patience", 0}};
       },
       "distributed.early_stopping.patience (0) must be between 1 and 10000"},
      {[](json& b) {
         b["distributed"]["early_stopping"] = {{"patience", 2}, {"min_delta", -0.1}};
       },
       "distributed.early_stopping.min_delta (-0.1) must be >= 0 and <= 1e+09"},
      {[](json& b) {
         b["distributed"]["early_stopping"] = {{"patience", 2}, {"mindelta", 0.1}};
       },
       "unknown field distributed.early_stopping.mindelta"},
      {[](json& b) { b["distributed"]["early_stopping"] = 2; },
       "distributed.early_stopping must be an object, got number"},
      // distributed.compression
      {[](json& b) {
         b["distributed"]["compression"] = {{"update", "int2"}};
       },
       "distributed.compression.update must be one of \"none\", \"bf16\", \"int8\", \"int4\", got \"int2\""},
      {[](json& b) {
         b["distributed"]["compression"] = {{"global", "int8"}};
       },
       "distributed.compression.global must be one of \"none\", \"delta_bf16\", \"delta_int8\", \"delta_int4\", got "
       "\"int8\""},
      {[](json& b) {
         b["distributed"]["compression"] = {{"update", "int8"}, {"zstd_level", 20}};
       },
       "distributed.compression.zstd_level (20) must be between 0 and 19"},
      {[](json& b) {
         b["distributed"]["compression"] = {{"update", "int8"}, {"delta", "yes"}};
       },
       "distributed.compression.delta must be a boolean, got string"},
      {[](json& b) {
         b["distributed"]["compression"] = {{"update", "none"}, {"delta", true}};
       },
       "distributed.compression.delta needs distributed.compression.update \"bf16\", \"int8\" or \"int4\" (a "
       "delta travels encoded); set update or remove delta"},
      {[](json& b) {
         b["distributed"]["compression"] = {{"error_feedback", true}};
       },
       "distributed.compression.error_feedback needs a lossy distributed.compression.update (\"bf16\", \"int8\" "
       "or \"int4\"): \"none\" has no quantisation error to carry; set update or remove error_feedback"},
      {[](json& b) {
         b["distributed"]["compression"] = {{"update", "int8"}, {"level", 3}};
       },
       "unknown field distributed.compression.level"},
      {[](json& b) { b["distributed"]["compression"] = "int8"; },
       "distributed.compression must be an object, got string"},
      // distributed.partition (the label's checks against the dataset are the API's: tests/coordinator/api_test.cc)
      {[](json& b) {
         b["distributed"]["partition"] = {{"method", "dirichlet"}, {"alpha", -1}};
       },
       "distributed.partition.alpha (-1) must be > 0 and <= 1e+06"},
      {[](json& b) {
         b["distributed"]["partition"] = {{"method", "dirichlet"}, {"alpha", 0}};
       },
       "distributed.partition.alpha (0) must be > 0 and <= 1e+06"},
      {[](json& b) {
         b["distributed"]["partition"] = {{"method", "shards_per_worker"}, {"classes_per_worker", 0}};
       },
       "distributed.partition.classes_per_worker (0) must be between 1 and 10000"},
      {[](json& b) {
         b["distributed"]["partition"] = {{"method", "by_label"}};
       },
       "distributed.partition.method must be one of \"iid\", \"dirichlet\", \"shards_per_worker\", got \"by_label\""},
      {[](json& b) {
         b["distributed"]["partition"] = {{"method", "iid"}, {"alpha", 0.5}};
       },
       "distributed.partition.alpha applies only to method \"dirichlet\", not \"iid\""},
      {[](json& b) {
         b["distributed"]["partition"] = {{"method", "dirichlet"}, {"classes_per_worker", 2}};
       },
       "distributed.partition.classes_per_worker applies only to method \"shards_per_worker\", not \"dirichlet\""},
      {[](json& b) {
         b["distributed"]["partition"] = {{"method", "dirichlet"}, {"label", ""}};
       },
       "distributed.partition.label must be 1..256 bytes long, got 0"},
      {[](json& b) {
         b["distributed"]["partition"] = {{"method", "dirichlet"}, {"beta", 1}};
       },
       "unknown field distributed.partition.beta"},
      {[](json& b) { b["distributed"]["partition"] = "dirichlet"; },
       "distributed.partition must be an object, got string"},
      {[](json& b) {
         b.erase("dataset_id");
         b["data"] = {{"source", "workers"}, {"max_samples_per_worker", 100}};
         b["distributed"]["partition"] = {{"method", "dirichlet"}};
       },
       "distributed.partition applies only to data.source \"platform\": with \"workers\" each worker trains on its "
       "own file, which the coordinator does not split; remove distributed.partition"},
      {[](json& b) {
         b["distributed"]["enabled"] = false;
         b["distributed"]["early_stopping"] = {{"patience", 2}};
       },
       "distributed.early_stopping needs distributed.enabled true: an ordinary job trains one round, so there is "
       "nothing to stop early; remove early_stopping or make the job distributed"},
      {[](json& b) {
         b["distributed"]["min_workers"] = 3;
         b["distributed"]["max_workers"] = 2;
       },
       "distributed.min_workers (3) must be <= distributed.max_workers (2)"},
      {[](json& b) {
         b["distributed"]["min_workers"] = 4;
         b["distributed"]["max_workers"] = 5;
       },
       "distributed.min_workers (4) exceeds the number of workers listed in worker_selection (3)"},
      {[](json& b) { b["distributed"]["aggregation_timeout"] = 0; },
       "distributed.aggregation_timeout (0) must be >= 1 and <= 604800"},
      {[](json& b) { b["distributed"]["aggregation_timeout"] = "10m"; },
       "distributed.aggregation_timeout must be a number, got string"},
      {[](json& b) { b["distributed"]["fault_tolerance"] = 0; },
       "distributed.fault_tolerance (0) must be between 1 and 1000"},
      {[](json& b) { b["worker_selection"]["mode"] = "any"; },
       "worker_selection.mode must be one of \"own\", \"managed\", \"mixed\", \"auto\", got \"any\""},
      {[](json& b) {
         b["worker_selection"]["worker_ids"] = {1, -3};
       },
       "worker_selection.worker_ids[1] (-3) must be between 1 and 9223372036854775807"},
      {[](json& b) {
         b["worker_selection"]["worker_ids"] = {1, 1, 3};
       },
       "worker_selection.worker_ids lists worker 1 twice"},
      {[](json& b) { b["worker_selection"]["parsyn_worker_ids"] = {3}; },
       "worker_selection.parsyn_worker_ids lists worker 3, which worker_selection.worker_ids lists too"},
      {[](json& b) { b["worker_selection"]["mode"] = "own"; },
       "worker_selection.mode \"own\" must not list worker_selection.parsyn_worker_ids"},
      {[](json& b) { b["worker_selection"]["mode"] = "managed"; },
       "worker_selection.mode \"managed\" must not list worker_selection.worker_ids"},
      {[](json& b) { b["worker_selection"]["mode"] = "auto"; },
       "worker_selection.mode \"auto\" chooses workers itself and must not list worker ids"},
      {[](json& b) { b["worker_selection"]["parsyn_worker_ids"] = json::array(); },
       "worker_selection.mode \"mixed\" needs both worker_selection.worker_ids and "
       "worker_selection.parsyn_worker_ids"},
      {[](json& b) {
         b["worker_selection"] = {{"parsyn_worker_ids", {5}}};
       },
       "distributed.min_workers (2) exceeds the number of workers listed in worker_selection (1)"},
      {[](json& b) {
         b["config"]["epochs"] = 0;
         b["config"]["lerning_rate"] = 1;
         b["distributed"]["num_rounds"] = "ten";
       },
       "config.epochs (0) must be between 1 and 1000; unknown field config.lerning_rate; "
       "distributed.num_rounds must be an integer, got string"},
  };
  for (const BadCase& c : cases) {
    json body = SpecExample();
    c.edit(body);
    StatusOr<JobSpec> spec = ParseJobSpec(body.dump());
    ASSERT_FALSE(spec.ok()) << "accepted: " << body.dump();
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(spec.status().message(), c.message) << body.dump();
    // The same problems one by one, each with the field it is about (the API's error.errors).
    std::vector<FieldProblem> problems;
    ASSERT_FALSE(ParseJobSpecJson(body, problems).ok());
    ASSERT_FALSE(problems.empty());
    std::string joined;
    for (const FieldProblem& p : problems) {
      joined += (joined.empty() ? "" : "; ") + p.message;
      EXPECT_FALSE(p.field.empty()) << "no field for: " << p.message;
      EXPECT_THAT(p.message, HasSubstr(p.field)) << "the message does not name its field";
    }
    EXPECT_EQ(joined, c.message);
  }
}

TEST(JobSpecTest, StrategyOptionsAreNormalisedWithTheirDefaults) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"federated_averaging", json::object()},
      {"fedprox", {{"mu", 0.01}}},
      {"fedavgm", {{"server_learning_rate", 1.0}, {"server_momentum", 0.9}}},
      {"fedadam", {{"server_learning_rate", 0.1}, {"beta1", 0.9}, {"beta2", 0.99}, {"tau", 1e-9}}},
      {"fedyogi", {{"server_learning_rate", 0.01}, {"beta1", 0.9}, {"beta2", 0.99}, {"tau", 1e-3}}},
      {"fedadagrad", {{"server_learning_rate", 0.1}, {"beta1", 0.0}, {"tau", 1e-9}}},
  };
  for (const auto& [name, options] : cases) {
    SCOPED_TRACE(name);
    json body = SpecExample();
    body["distributed"]["strategy"] = name;
    StatusOr<JobSpec> spec = ParseJobSpecJson(body);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    EXPECT_EQ(JobSpecToJson(*spec)["distributed"]["strategy_options"], options);
    // Given options and sampling stay; the normalised form parses back to the same spec.
    body["distributed"]["strategy_options"] = {{"sample_count", 4}};
    if (name == "fedadam") body["distributed"]["strategy_options"]["beta2"] = 0.999;
    spec = ParseJobSpecJson(body);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const json normalised = JobSpecToJson(*spec);
    EXPECT_EQ(normalised["distributed"]["strategy_options"]["sample_count"], 4);
    StatusOr<JobSpec> again = ParseJobSpec(normalised.dump());
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(*again, *spec);
  }
}

// The catalog the dashboard's job form offers: every strategy in the documented order, its options in theirs, each
// with the default a spec without it gets (null: none).
TEST(JobSpecTest, StrategyCatalogListsEveryStrategyWithItsOptionsDefaults) {
  const json catalog = StrategyCatalogJson();
  std::vector<std::string> names;
  for (const json& s : catalog) names.push_back(s["name"]);
  EXPECT_EQ(names,
            (std::vector<std::string>{"federated_averaging", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad",
                                      "median", "trimmed_mean", "krum", "multi_krum", "dp_fedavg"}));
  auto option = [](const std::string& name, const json& value, bool required = false) {
    return json{{"name", name}, {"default", value}, {"required", required}};
  };
  EXPECT_EQ(catalog[0]["options"], json::array());
  EXPECT_EQ(catalog[3]["options"], json::array({option("server_learning_rate", 0.1), option("beta1", 0.9),
                                                option("beta2", 0.99), option("tau", 1e-9)}));
  EXPECT_EQ(catalog[9]["options"], json::array({option("f", 0), option("m", nullptr)}));
  EXPECT_EQ(catalog[10]["options"],
            json::array({option("clip_norm", nullptr, true), option("noise_multiplier", 1.0), option("delta", 1e-5)}));
  // Each default is what a spec that leaves the option out is normalised with.
  for (const json& s : catalog) {
    SCOPED_TRACE(s["name"].get<std::string>());
    json body = SpecExample();
    body["distributed"]["strategy"] = s["name"];
    body["distributed"]["min_workers"] = 3;  // krum's 2f + 3
    if (s["name"] == "dp_fedavg") body["distributed"]["strategy_options"] = {{"clip_norm", 1.0}};
    StatusOr<JobSpec> spec = ParseJobSpecJson(body);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const json normalised = JobSpecToJson(*spec)["distributed"]["strategy_options"];
    for (const json& o : s["options"]) {
      if (o["required"]) continue;
      EXPECT_EQ(normalised[o["name"].get<std::string>()], o["default"]) << o;
    }
  }
}

TEST(JobSpecTest, EachProblemComesWithItsField) {
  json body = SpecExample();
  body["config"]["lerning_rate"] = 1;
  body["config"]["lora_target_modules"] = {"q_proj", 7};
  body["distributed"]["enabled"] = false;
  body["distributed"]["early_stopping"] = {{"patience", 2}};  // its message holds a "; " of its own
  std::vector<FieldProblem> problems;
  StatusOr<JobSpec> spec = ParseJobSpecJson(body, problems);
  ASSERT_FALSE(spec.ok());
  const std::vector<FieldProblem> expected = {
      {"config.lora_target_modules[1]", "config.lora_target_modules[1] must be a string, got number"},
      {"config.lerning_rate", "unknown field config.lerning_rate"},
      {"distributed.early_stopping",
       "distributed.early_stopping needs distributed.enabled true: an ordinary job trains one round, so there is "
       "nothing to stop early; remove early_stopping or make the job distributed"}};
  EXPECT_EQ(problems, expected);
  // A valid spec adds nothing.
  problems.clear();
  ASSERT_TRUE(ParseJobSpecJson(SpecExample(), problems).ok());
  EXPECT_TRUE(problems.empty());
}

TEST(JobSpecTest, ProblemFieldIsTheLeadingPathOfASpecKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"distributed.min_workers (3) must be <= distributed.max_workers (2)", "distributed.min_workers"},
      {"dataset_id: dataset 9 does not exist", "dataset_id"},
      {"worker_selection.worker_ids: worker 4242 does not exist", "worker_selection.worker_ids"},
      {"'name' must be 1..128 bytes", "name"},
      {"config.lora_target_modules[1] must be a string, got number", "config.lora_target_modules[1]"},
      {"unknown field colour", "colour"},
      {"unknown field config.odd key", "config.odd key"},
      {"worker_selection lists more than 10000 workers", "worker_selection"},
      {"request body must be a JSON object, got array", ""},
      {"request body is not valid JSON: parse error at line 1", ""},
      {"names must be unique", ""},
      {"", ""},
  };
  for (const auto& [message, field] : cases) EXPECT_EQ(ProblemField(message), field) << message;
}

// JobSpecWarnings of `body` (which must parse).
std::vector<std::string> WarningsOf(const json& body) {
  StatusOr<JobSpec> spec = ParseJobSpecJson(body);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return spec.ok() ? JobSpecWarnings(body, *spec) : std::vector<std::string>{};
}

TEST(JobSpecWarningsTest, EpochsGivenWithAStepBudgetIsIgnored) {
  // The product spec's example: epochs 3 and steps_per_round 500.
  EXPECT_EQ(WarningsOf(SpecExample()),
            (std::vector<std::string>{"config.epochs is ignored: distributed.steps_per_round (500) sets each round's "
                                      "length; set steps_per_round to 0 to train config.epochs passes per round"}));
  json body = SpecExample();
  body["config"].erase("epochs");  // the default: nothing was asked for
  EXPECT_THAT(WarningsOf(body), ::testing::IsEmpty());
  body["config"]["epochs"] = nullptr;  // null is absent
  EXPECT_THAT(WarningsOf(body), ::testing::IsEmpty());
  body = SpecExample();
  body["distributed"].erase("steps_per_round");  // the default step budget, 500, still wins
  EXPECT_THAT(WarningsOf(body), ::testing::ElementsAre(HasSubstr("config.epochs is ignored")));
  body["distributed"]["steps_per_round"] = 0;  // rounds of config.epochs passes: epochs counts
  EXPECT_THAT(WarningsOf(body), ::testing::IsEmpty());
  body = SpecExample();
  body["distributed"]["enabled"] = false;  // one worker, epochs passes; the distributed fields are what is ignored
  for (const std::string& w : WarningsOf(body)) EXPECT_THAT(w, Not(HasSubstr("config.epochs"))) << w;
}

TEST(JobSpecWarningsTest, DistributedFieldsOfAOneWorkerJobAreIgnored) {
  json body = SpecExample();
  body["distributed"]["enabled"] = false;
  body["distributed"]["join_window"] = nullptr;  // null is absent
  const std::string why = " is ignored: distributed.enabled is false (the job trains on one worker)";
  EXPECT_EQ(WarningsOf(body),
            (std::vector<std::string>{"distributed.aggregation_timeout" + why, "distributed.fault_tolerance" + why,
                                      "distributed.max_workers" + why, "distributed.min_workers" + why,
                                      "distributed.num_rounds" + why, "distributed.steps_per_round" + why}));
  // The dashboard form's default: enabled false and the one strategy, nothing else.
  body["distributed"] = {{"enabled", false}, {"strategy", "federated_averaging"}};
  EXPECT_THAT(WarningsOf(body), ::testing::IsEmpty());
  body.erase("distributed");
  EXPECT_THAT(WarningsOf(body), ::testing::IsEmpty());
}

TEST(JobSpecWarningsTest, LoraFieldsOfAFullFineTuneAreIgnored) {
  json body = SpecExample();  // gives lora_r and lora_alpha
  body["config"]["use_peft"] = false;
  body["config"]["lora_dropout"] = 0.1;
  body["distributed"]["steps_per_round"] = 0;
  const std::string why = " is ignored: config.use_peft is false (every weight is trained, no LoRA adapters)";
  EXPECT_EQ(WarningsOf(body),
            (std::vector<std::string>{"config.lora_r" + why, "config.lora_alpha" + why, "config.lora_dropout" + why}));
  body["config"]["use_peft"] = true;
  EXPECT_THAT(WarningsOf(body), ::testing::IsEmpty());
}

// data.source "workers": no dataset, a bound on what each worker may claim; every misuse named.
TEST(JobSpecTest, DataFromTheWorkers) {
  json body = SpecExample();
  body.erase("dataset_id");
  body["data"] = {{"source", "workers"}, {"max_samples_per_worker", 5000}};
  StatusOr<JobSpec> spec = ParseJobSpecJson(body);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data, (JobData{.source = DataSource::kWorkers, .max_samples_per_worker = 5000}));
  EXPECT_EQ(spec->dataset_id, 0);
  const json normalised = JobSpecToJson(*spec);
  EXPECT_TRUE(normalised["dataset_id"].is_null());
  EXPECT_EQ(normalised["data"], (json{{"source", "workers"}, {"max_samples_per_worker", 5000}}));
  EXPECT_EQ(*ParseJobSpecJson(normalised), *spec);
  body["dataset_id"] = nullptr;  // null is absent
  EXPECT_TRUE(ParseJobSpecJson(body).ok());
  // "platform" is the default, spelled out or not.
  json platform = SpecExample();
  platform["data"] = {{"source", "platform"}};
  EXPECT_EQ(ParseJobSpecJson(platform)->data, JobData{});

  const std::vector<BadCase> cases = {
      {[](json& b) {
         b["data"] = {{"source", "workers"}, {"max_samples_per_worker", 10}};
       },
       "dataset_id must be absent or null when data.source is \"workers\": the workers train on their own files "
       "(parsyn worker --data)"},
      {[](json& b) {
         b.erase("dataset_id");
         b["data"] = {{"source", "workers"}};
       },
       "data.max_samples_per_worker is required when data.source is \"workers\": the most training samples one "
       "worker's update may claim (its weight in the average)"},
      {[](json& b) {
         b.erase("dataset_id");
         b["data"] = {{"source", "workers"}, {"max_samples_per_worker", 0}};
       },
       "data.max_samples_per_worker (0) must be between 1 and 1000000000"},
      {[](json& b) {
         b["data"] = {{"max_samples_per_worker", 10}};
       },
       "data.max_samples_per_worker applies only to data.source \"workers\" (a platform shard bounds it)"},
      {[](json& b) {
         b.erase("dataset_id");
         b["data"] = {{"source", "platform"}};
       },
       "dataset_id is required"},
      {[](json& b) {
         b["data"] = {{"source", "laptop"}};
       },
       "data.source must be one of \"platform\", \"workers\", got \"laptop\""},
      {[](json& b) {
         b["data"] = {{"path", "/data"}};
       },
       "unknown field data.path"},
      {[](json& b) { b["data"] = "workers"; }, "data must be an object, got string"},
  };
  for (const BadCase& c : cases) {
    json bad = SpecExample();
    c.edit(bad);
    StatusOr<JobSpec> parsed = ParseJobSpecJson(bad);
    ASSERT_FALSE(parsed.ok()) << "accepted: " << bad.dump();
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message(), c.message) << bad.dump();
  }
}

TEST(JobSpecTest, MalformedJson) {
  StatusOr<JobSpec> spec = ParseJobSpec(R"({"name": "x", )");
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("request body is not valid JSON: parse error at line 1"));

  spec = ParseJobSpec("[1, 2]");
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(), "request body must be a JSON object, got array");

  spec = ParseJobSpec("");
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn::coordinator

namespace parsyn::coordinator {
namespace {

TEST(JobSpecTest, SecureAggregationIsReadCheckedAndNormalised) {
  json body = SpecExample();
  body["distributed"]["secure_aggregation"] = {{"enabled", true}, {"threshold", 2}, {"quantization_bits", 8}};
  StatusOr<JobSpec> spec = ParseJobSpec(body.dump());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->distributed.secure_aggregation.enabled);
  EXPECT_EQ(spec->distributed.secure_aggregation.threshold_count, 2);
  const json normal = JobSpecToJson(*spec);
  EXPECT_EQ(normal["distributed"]["secure_aggregation"]["clipping_range"], 8.0);
  StatusOr<JobSpec> again = ParseJobSpec(normal.dump());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *spec);
  EXPECT_FALSE(JobSpecToJson(*ParseJobSpec(SpecExample().dump()))["distributed"].contains("secure_aggregation"));

  for (const auto& [edit, words] : std::vector<std::pair<std::function<void(json&)>, std::string>>{
           {[](json& b) { b["distributed"]["strategy"] = "median"; }, "distributed.strategy \"median\""},
           {[](json& b) {
              b["distributed"]["compression"] = {{"update", "int8"}};
            },
            "distributed.compression"},
           {[](json& b) {
              b["config"]["lora_ranks"] = {{"1", 4}};
            },
            "config.lora_ranks"},
           {[](json& b) { b["distributed"]["secure_aggregation"]["threshold"] = 3; }, "distributed.min_workers (2)"},
           {[](json& b) { b["distributed"]["secure_aggregation"]["neighbors"] = "all"; },
            "distributed.secure_aggregation.neighbors"}}) {
    json bad = body;
    edit(bad);
    const Status status = ParseJobSpec(bad.dump()).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << bad.dump();
    EXPECT_NE(status.message().find(words), std::string::npos) << status.ToString();
  }
  // dp_fedavg runs with distributed noise: each worker clips and adds its share.
  json dp = body;
  dp["distributed"]["strategy"] = "dp_fedavg";
  dp["distributed"]["strategy_options"] = {{"clip_norm", 0.5}, {"noise_multiplier", 1.1}};
  const StatusOr<JobSpec> private_sum = ParseJobSpec(dp.dump());
  ASSERT_TRUE(private_sum.ok()) << private_sum.status().ToString();
  EXPECT_TRUE(private_sum->distributed.secure_aggregation.enabled);
}

}  // namespace
}  // namespace parsyn::coordinator
