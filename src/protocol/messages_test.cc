#include "protocol/messages.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <utility>

namespace parsyn::protocol {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

const std::string kShaA(64, 'a'), kShaB(64, 'b'), kShaC(64, 'c'), kShaD(64, 'd');

// What TaskJsonText wrote, read back as a JSON document (compared as documents: the key order is the writer's).
json Written(const Task& task) { return json::parse(TaskJsonText(task)); }

// A train task as coordinator/job_runner.cc builds it (S3 multipart grant), field for field.
json CoordinatorTask() {
  json config = TrainingConfigToJson(TrainingConfig{});
  config["batch_size"] = 4;
  return {
      {"task_id", "3-2-1-w5"},
      {"job_id", 3},
      {"kind", "train"},
      {"round", 2},
      {"attempt", 1},
      {"total_rounds", 4},
      {"shard", 1},
      {"seed", 0xffff'ffff'ffff'fff0ULL},
      {"steps_per_round", 10},
      {"config", config},
      {"deadline_unix_ms", 1'700'000'000'000},
      {"global_weights", {{"url", "http://c/blobs/g?sig=1"}, {"sha256", kShaA}, {"size_bytes", 1234}, {"round", 1}}},
      {"data_source", "platform"},
      {"data",
       {{"format", "jsonl"},
        {"kind", "text"},
        {"train_url", "http://c/blobs/t?sig=2"},
        {"train_sha256", kShaB},
        {"train_rows", 90},
        {"validation_url", "http://c/blobs/v?sig=3"},
        {"validation_sha256", kShaC},
        {"validation_rows", 10}}},
      {"model",
       {{"id", 7},
        {"name", "tiny"},
        {"model_type", "llama"},
        {"files",
         {{{"path", "config.json"}, {"url", "http://c/blobs/m?sig=4"}, {"sha256", kShaD}, {"size_bytes", 5}}}}}},
      {"update_upload",
       {{"blob_key", "jobs/3/updates/r2a1w5.safetensors"},
        {"max_size_bytes", 5000},
        {"multipart",
         {{"part_size_bytes", 4096},
          {"parts",
           {{{"part_number", 1}, {"url", "https://s3/p1"}, {"headers", json::object()}},
            {{"part_number", 2}, {"url", "https://s3/p2"}, {"headers", {{"x-amz-checksum", "x"}}}}}}}}}},
  };
}

// The final evaluation runs as round total_rounds + 1; logs call it that, never "round 5/4".
TEST(TaskMessageTest, RoundsAreLabelledAndTheFinalEvaluationByName) {
  EXPECT_EQ(RoundLabel(2, 4), "round 2/4");
  EXPECT_EQ(RoundLabel(4, 4), "round 4/4");
  EXPECT_EQ(RoundLabel(5, 4), "the final evaluation");
  EXPECT_EQ(RoundLabel(3, 0), "round 3");  // total not known
}

TEST(TaskMessageTest, ReadsTheCoordinatorsTaskAndWritesItBackByteForByte) {
  const json wire = CoordinatorTask();
  auto task = ParseTask(wire);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ(task->kind, TaskKind::kTrain);
  EXPECT_EQ(task->seed, 0xffff'ffff'ffff'fff0ULL);
  EXPECT_EQ(task->config.batch_size, 4);
  EXPECT_EQ(task->model.files.at(0).path, "config.json");
  ASSERT_TRUE(task->update_upload && task->update_upload->multipart);
  EXPECT_EQ(task->update_upload->multipart->parts.at(1).headers.at("x-amz-checksum"), "x");
  EXPECT_EQ(Written(*task).dump(), wire.dump());

  // The directory store's grant (one signed PUT) and S3's single PUT with its headers.
  json single = wire;
  single["update_upload"] = {{"blob_key", "k"}, {"max_size_bytes", 9}, {"url", "http://c/blobs/k?sig=5"}};
  EXPECT_EQ(Written(*ParseTask(single)).dump(), single.dump());
  single["update_upload"]["headers"] = {{"If-None-Match", "*"}};
  EXPECT_EQ(Written(*ParseTask(single)).dump(), single.dump());
  json evaluate = wire;
  evaluate["kind"] = "evaluate";
  evaluate.erase("update_upload");
  EXPECT_EQ(Written(*ParseTask(evaluate)).dump(), evaluate.dump());
}

// The coordinator dumps the job's config once and hands it to every task: the same text as the task's own config.
TEST(TaskMessageTest, ATaskWrittenWithItsConfigAlreadyDumpedIsTheSame) {
  auto task = ParseTask(CoordinatorTask());
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  const std::string config_json = TrainingConfigToJson(task->config).dump();
  EXPECT_EQ(TaskJsonText(*task, config_json), TaskJsonText(*task));
  task->model.name = "a \"quoted\" name with a \\ and \xc3\xa9";
  StatusOr<Task> read = ParseTask(Written(*task));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, *task);
}

// FedProx's mu rides on the task: absent (0, plain FedAvg) on the wire unless set, so FedAvg tasks keep their bytes.
TEST(TaskMessageTest, CarriesProximalMuOnlyWhenSet) {
  const json wire = CoordinatorTask();
  EXPECT_FALSE(wire.contains("proximal_mu"));
  EXPECT_EQ(ParseTask(wire)->proximal_mu, 0);
  EXPECT_FALSE(Written(*ParseTask(wire)).contains("proximal_mu"));

  json fedprox = wire;
  fedprox["proximal_mu"] = 0.01;
  auto task = ParseTask(fedprox);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_DOUBLE_EQ(task->proximal_mu, 0.01);
  EXPECT_EQ(Written(*task).dump(), fedprox.dump());
  EXPECT_EQ(*ParseTask(Written(*task)), *task);
  fedprox["proximal_mu"] = kMaxProximalMu;  // the bound itself is allowed
  EXPECT_TRUE(ParseTask(fedprox).ok());
  fedprox["proximal_mu"] = 0;  // an explicit 0 is FedAvg too
  EXPECT_EQ(ParseTask(fedprox)->proximal_mu, 0);

  const std::pair<json, std::string> bad[] = {
      {-0.5, "'proximal_mu' (FedProx's mu) must be in 0..1e+06, got -0.5"},
      {2e6, "'proximal_mu' (FedProx's mu) must be in 0..1e+06, got 2e+06"},
      {std::nan(""), "'proximal_mu' must be finite"},
      {"0.1", "'proximal_mu' must be a number, got string"},
  };
  for (const auto& [value, message] : bad) {
    json task_json = wire;
    task_json["proximal_mu"] = value;
    auto parsed = ParseTask(task_json);
    ASSERT_FALSE(parsed.ok()) << value;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message(), message);
  }
}

TEST(TaskMessageTest, SaysWhenTheRoundIsSecurelyAggregated) {
  const json wire = CoordinatorTask();
  EXPECT_FALSE(ParseTask(wire)->secure_aggregation);
  EXPECT_FALSE(Written(*ParseTask(wire)).contains("secure_aggregation"));
  json secure = wire;
  secure["secure_aggregation"] = true;
  auto task = ParseTask(secure);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_TRUE(task->secure_aggregation);
  EXPECT_EQ(*ParseTask(Written(*task)), *task);
  secure["secure_aggregation"] = "yes";
  EXPECT_EQ(ParseTask(secure).status().code(), StatusCode::kInvalidArgument);
}

// distributed.compression: how to encode the update, and the global's zstd copy; both absent when off.
TEST(TaskMessageTest, CarriesCompressionAndTheGlobalsZstdCopyOnlyWhenOn) {
  const json wire = CoordinatorTask();
  EXPECT_EQ(ParseTask(wire)->compression, UpdateCompression{});
  EXPECT_FALSE(ParseTask(wire)->global_weights.zstd.has_value());
  EXPECT_FALSE(Written(*ParseTask(wire)).contains("compression"));

  json compressed = wire;
  compressed["compression"] = {
      {"update", "int8"}, {"delta", true}, {"zstd_level", 3}, {"error_feedback", false}, {"global", "delta_int8"}};
  compressed["global_weights"]["zstd"] = {{"url", "http://c/blobs/g.zst?sig=9"}, {"sha256", kShaD}, {"size_bytes", 99}};
  compressed["global_weights"]["delta"] = {{"url", "http://c/blobs/g.delta?sig=8"},
                                           {"sha256", kShaD},
                                           {"size_bytes", 40},
                                           {"base_sha256", kShaD},
                                           {"codec", "int8"},
                                           {"zstd", true},
                                           {"metadata", {{"format", "pt"}}}};
  auto task = ParseTask(compressed);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ(task->compression.update, "int8");
  EXPECT_TRUE(task->compression.delta);
  EXPECT_EQ(task->compression.zstd_level, 3);
  ASSERT_TRUE(task->global_weights.zstd.has_value());
  EXPECT_EQ(task->global_weights.zstd->size_bytes, 99u);
  EXPECT_EQ(task->compression.global, "delta_int8");
  ASSERT_TRUE(task->global_weights.delta.has_value());
  EXPECT_EQ(task->global_weights.delta->codec, "int8");
  EXPECT_EQ(task->global_weights.delta->metadata, (std::vector<std::pair<std::string, std::string>>{{"format", "pt"}}));
  EXPECT_EQ(Written(*task), compressed);
  EXPECT_EQ(*ParseTask(Written(*task)), *task);

  const std::pair<std::function<void(json&)>, std::string> bad[] = {
      {[](json& t) { t["compression"]["update"] = "int2"; },
       "'compression.update' must be one of none, bf16, int8, int4, got 'int2'"},
      {[](json& t) { t["compression"]["zstd_level"] = 20; }, "'compression.zstd_level' must be in 0..19, got 20"},
      {[](json& t) { t["global_weights"]["zstd"].erase("sha256"); }, "missing field 'global_weights.zstd.sha256'"},
      {[](json& t) { t["compression"]["global"] = "int8"; },
       "'compression.global' must be one of none, delta_bf16, delta_int8, delta_int4, got 'int8'"},
      {[](json& t) { t["global_weights"]["delta"]["codec"] = "fp8"; },
       "'global_weights.delta.codec' must be one of bf16, int8, int4, got 'fp8'"},
      {[](json& t) { t["global_weights"]["delta"].erase("base_sha256"); },
       "missing field 'global_weights.delta.base_sha256'"},
  };
  for (const auto& [edit, message] : bad) {
    json task_json = compressed;
    edit(task_json);
    auto parsed = ParseTask(task_json);
    ASSERT_FALSE(parsed.ok()) << message;
    EXPECT_EQ(parsed.status().message(), message);
  }
}

TEST(TaskMessageTest, IgnoresFieldsItDoesNotKnowAndNamesBadOnes) {
  json task = CoordinatorTask();
  task["added_later"] = true;
  EXPECT_TRUE(ParseTask(task).ok());

  task = CoordinatorTask();
  task.erase("round");
  EXPECT_EQ(ParseTask(task).status().message(), "missing field 'round'");
  task = CoordinatorTask();
  task["job_id"] = "three";
  EXPECT_EQ(ParseTask(task).status().message(), "'job_id' must be an integer, got string");
  task = CoordinatorTask();
  task["kind"] = "bake";
  EXPECT_EQ(ParseTask(task).status().message(), "'kind' must be one of train, evaluate, got 'bake'");
  task = CoordinatorTask();
  task.erase("update_upload");
  EXPECT_EQ(ParseTask(task).status().message(), "a train task needs 'update_upload'");
  task = CoordinatorTask();
  task["global_weights"].erase("url");
  task["model"]["files"][0]["sha256"] = 5;
  EXPECT_EQ(ParseTask(task).status().message(),
            "missing field 'global_weights.url'; 'model.files[0].sha256' must be a string, got number");
  task = CoordinatorTask();
  task["config"]["lora_r"] = 0;
  EXPECT_EQ(ParseTask(task).status().message(), "config.lora_r (0) must be between 1 and 1024");
  EXPECT_EQ(ParseTask(json::array()).status().message(), "a task must be a JSON object, got array");
}

// The shard's files carry the sha256 the coordinator recorded: the worker caches and checks them by it, so a task
// without them (or with something else there) is refused, naming the field.
TEST(TaskMessageTest, CarriesTheShardsChecksumsAndRefusesTasksWithoutThem) {
  auto task = ParseTask(CoordinatorTask());
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ(task->data.train_sha256, kShaB);
  EXPECT_EQ(task->data.validation_sha256, kShaC);
  EXPECT_EQ(task->global_weights.sha256, kShaA);

  json wire = CoordinatorTask();
  wire["data"].erase("train_sha256");
  wire["data"].erase("validation_sha256");
  EXPECT_EQ(ParseTask(wire).status().message(),
            "missing field 'data.train_sha256'; missing field 'data.validation_sha256'");
  wire = CoordinatorTask();
  wire["data"]["train_sha256"] = "ab";
  wire["global_weights"]["sha256"] = std::string(64, 'A');
  wire["model"]["files"][0]["sha256"] = "../" + std::string(61, 'a');
  EXPECT_EQ(ParseTask(wire).status().message(),
            "'global_weights.sha256' must be 64 lowercase hex digits (a sha256), got '" + std::string(64, 'A') +
                "'; 'data.train_sha256' must be 64 lowercase hex digits (a sha256), got 'ab'; 'model.files[0].sha256' "
                "must be 64 lowercase hex digits (a sha256), got '../" +
                std::string(61, 'a') + "'");
  EXPECT_TRUE(IsSha256Hex(kShaA));
  EXPECT_FALSE(IsSha256Hex(kShaA + "a"));
}

TEST(TaskMessageTest, SaysWhereItsDataComesFrom) {
  json task = CoordinatorTask();
  task["data_source"] = "workers";
  task["data"] = json::object();  // no shard: the worker's own file
  auto workers = ParseTask(task);
  ASSERT_TRUE(workers.ok()) << workers.status().ToString();
  EXPECT_EQ(workers->data_source, DataSource::kWorkers);
  EXPECT_EQ(Written(*workers).dump(), task.dump());
  // Its writer leaves `data` empty, so its reader keeps nothing of it either: what is read is what is written back
  // (fuzz_worker_task's invariant).
  task["data"] = {{"format", "csv"}, {"train_rows", 5}};
  workers = ParseTask(task);
  ASSERT_TRUE(workers.ok()) << workers.status().ToString();
  EXPECT_EQ(workers->data, TaskData{});
  EXPECT_EQ(*ParseTask(Written(*workers)), *workers);
  task["data"] = json::object();
  // A coordinator from before data sources sends none: the platform's shard.
  task.erase("data_source");
  EXPECT_EQ(ParseTask(task)->data_source, DataSource::kPlatform);
  task["data_source"] = "laptop";
  EXPECT_EQ(ParseTask(task).status().message(), "'data_source' must be one of platform, workers, got 'laptop'");
}

TEST(TaskMessageTest, RejectsAbsurdSizes) {
  json task = CoordinatorTask();
  task["round"] = 2'000'000;
  EXPECT_EQ(ParseTask(task).status().message(), "'round' must be in 1..1000000, got 2000000");
  task = CoordinatorTask();
  task["global_weights"]["url"] = std::string(kMaxUrlBytes + 1, 'u');
  EXPECT_THAT(ParseTask(task).status().message(), HasSubstr("'global_weights.url' must be 1..8192 bytes"));
  task = CoordinatorTask();
  task["update_upload"]["multipart"]["parts"] = json::array();
  for (int i = 0; i < 10'001; ++i) task["update_upload"]["multipart"]["parts"].push_back(json::object());
  EXPECT_THAT(ParseTask(task).status().message(),
              HasSubstr("'update_upload.multipart.parts' has 10001 items, at most 10000 are allowed"));
}

// A task_id of "../../.." from a compromised coordinator or a man in the middle once named a folder the worker
// removed; a task_id is a name now, never a path.
TEST(TaskMessageTest, TaskIdIsANameNotAPath) {
  for (const std::string& bad : std::vector<std::string>{"../../..", "..", "a/b", std::string(65, 'a')}) {
    json task = CoordinatorTask();
    task["task_id"] = bad;
    EXPECT_THAT(ParseTask(task).status().message(), HasSubstr("'task_id' must be 1..64 letters, digits, '-' or '_'"))
        << bad;
  }
  json task = CoordinatorTask();
  task["task_id"] = "12-3-1-w_5";
  EXPECT_TRUE(ParseTask(task).ok());
}

TEST(HelloTest, RoundTripsAndAcceptsAnEmptyBody) {
  Hello hello{.device = "cuda:0", .version = "parsyn-worker 0.1.0"};
  EXPECT_EQ(HelloToJson(hello), (json{{"device", "cuda:0"}, {"version", "parsyn-worker 0.1.0"}}));
  EXPECT_EQ(*ParseHello(HelloToJson(hello).dump()), hello);
  EXPECT_EQ(*ParseHello(""), Hello{});
  EXPECT_EQ(ParseHello(R"({"device": 1, "gpu": "a"})").status().message(),
            "unknown field 'gpu'; 'device' must be a string, got number");

  // A worker started with --data announces its file's shape (never its contents).
  Hello local{.device = "cpu", .local_data = LocalData{.format = "csv", .rows = 354}};
  EXPECT_EQ(HelloToJson(local), (json{{"device", "cpu"}, {"local_data", {{"format", "csv"}, {"rows", 354}}}}));
  EXPECT_EQ(*ParseHello(HelloToJson(local).dump()), local);
  EXPECT_EQ(ParseHello(R"({"local_data": {"format": "xlsx", "rows": 0, "path": "/home/a"}})").status().message(),
            "unknown field 'local_data.path'; 'local_data.format' must be one of csv, jsonl, got 'xlsx'; "
            "'local_data.rows' must be in 1..1000000000000, got 0");
  EXPECT_EQ(ParseHello(R"({"local_data": {"format": "csv"}})").status().message(), "missing field 'local_data.rows'");
  EXPECT_EQ(ParseHello(R"({"local_data": 5})").status().message(), "'local_data' must be an object, got number");

  // What the worker can train: its device's memory and, when started with --lora-rank, the highest rank it takes.
  Hello sized{.device = "cuda:0", .device_memory_bytes = 85'899'345'920, .lora_rank = 8};
  EXPECT_EQ(HelloToJson(sized),
            (json{{"device", "cuda:0"}, {"device_memory_bytes", 85'899'345'920}, {"lora_rank", 8}}));
  EXPECT_EQ(*ParseHello(HelloToJson(sized).dump()), sized);
  EXPECT_EQ(ParseHello(R"({"device_memory_bytes": 0, "lora_rank": 2000})").status().message(),
            "'device_memory_bytes' must be in 1..9223372036854775807, got 0; 'lora_rank' must be in 1..1024, got 2000");

  HelloAnswer answer{.worker_id = 4,
                     .session_id = "pss_1",
                     .heartbeat_interval_ms = 1000,
                     .heartbeat_timeout_ms = 9000,
                     .max_poll_wait_ms = 200,
                     .worker_name = "gpu-box-1"};
  EXPECT_EQ(*ParseHelloAnswer(HelloAnswerToJson(answer)), answer);
  auto minimal = ParseHelloAnswer(json{{"session_id", "s1"}});
  ASSERT_TRUE(minimal.ok());
  EXPECT_EQ(minimal->heartbeat_interval_ms, 5'000);
  EXPECT_EQ(minimal->max_poll_wait_ms, 30'000);
  // Found by fuzz_worker_task: an answer without a worker id was written back with worker_id 0, which the reader
  // refuses. Every accepted message reads the same after its writer.
  EXPECT_EQ(*ParseHelloAnswer(HelloAnswerToJson(*minimal)), *minimal);
  EXPECT_EQ(ParseHelloAnswer(json::object()).status().message(), "missing field 'session_id'");
}

TEST(HeartbeatTest, RoundTripsWithTheAbandonList) {
  EXPECT_EQ(*ParseHeartbeat(HeartbeatToJson({.session_id = "s"}).dump()), Heartbeat{.session_id = "s"});
  EXPECT_EQ(ParseHeartbeat("{}").status().message(), "missing field 'session_id'");
  EXPECT_EQ(ParseHeartbeat("[1]").status().message(), "request body must be a JSON object, got array");
  HeartbeatAnswer answer{.abandon = {{.job_id = 7, .round = 2, .attempt = 1}}};
  const json wire = HeartbeatAnswerToJson(answer);
  EXPECT_EQ(wire, (json{{"abandon", {{{"job_id", 7}, {"round", 2}, {"attempt", 1}}}}}));
  EXPECT_EQ(*ParseHeartbeatAnswer(wire), answer);
  EXPECT_EQ(HeartbeatAnswerToJson({}), (json{{"abandon", json::array()}}));
  EXPECT_EQ(ParseHeartbeatAnswer(json{{"abandon", {{{"job_id", 7}}}}}).status().message(),
            "missing field 'abandon[0].round'; missing field 'abandon[0].attempt'");
  // Jobs that ended: present only when there are some.
  const HeartbeatAnswer ended{.ended_jobs = {3, 9}};
  EXPECT_EQ(HeartbeatAnswerToJson(ended), (json{{"abandon", json::array()}, {"ended_jobs", {3, 9}}}));
  EXPECT_EQ(*ParseHeartbeatAnswer(HeartbeatAnswerToJson(ended)), ended);
  EXPECT_EQ(ParseHeartbeatAnswer(json{{"ended_jobs", {0}}}).status().message(),
            "'ended_jobs' must hold job ids (integers >= 1)");
}

TEST(ProgressTest, RoundTripsAndChecksRanges) {
  Progress p{.session_id = "s",
             .job_id = 3,
             .round = 2,
             .attempt = 1,
             .step = 4,
             .total_steps = 10,
             .loss = 1.5,
             .throughput = 800.0,
             .throughput_unit = "tokens/s",
             .utilization = 0.5,
             .utilization_device = "host_cpu"};
  EXPECT_EQ(*ParseProgress(ProgressToJson(p).dump()), p);
  EXPECT_EQ(ProgressToJson(p)["utilization_device"], "host_cpu");
  Progress minimal{.job_id = 3, .round = 2, .step = 0};
  EXPECT_EQ(ProgressToJson(minimal), (json{{"job_id", 3}, {"round", 2}, {"step", 0}}));
  EXPECT_EQ(ParseProgress(R"({"job_id": 3, "round": 0, "step": 1, "utilization": 2})").status().message(),
            "'round' must be in 1..1000000, got 0; 'utilization' must be in 0..1");
  EXPECT_EQ(
      ParseProgress(R"({"job_id": 3, "round": 1, "step": 1, "throughput_unit": "rows/s", "utilization_device": "tpu"})")
          .status()
          .message(),
      "'throughput_unit' must be \"tokens/s\" or \"samples/s\", got \"rows/s\"; 'utilization_device' must be "
      "\"gpu\" or \"host_cpu\", got \"tpu\"");
}

TEST(ResultTest, RoundTripsAndRejectsUnknownFields) {
  Result r{.session_id = "pss_x",
           .job_id = 3,
           .round = 2,
           .attempt = 1,
           .blob_key = "jobs/3/u",
           .sha256 = "ab",
           .sample_count = 120,
           .train_loss = 2.5,
           .validation_loss = 3.0,
           .validation_samples = 30,
           .metrics = {{"steps", 10}}};
  EXPECT_EQ(*ParseResult(ResultToJson(r).dump()), r);
  Result evaluated{.job_id = 3, .round = 2, .attempt = 1};
  EXPECT_FALSE(ResultToJson(evaluated).contains("blob_key"));
  EXPECT_FALSE(ResultToJson(evaluated).contains("train_loss"));
  EXPECT_EQ(*ParseResult(ResultToJson(evaluated).dump()), evaluated);
  // Found by fuzz_route_bodies: an update without a sha256 was written back with "sha256": "", which the reader
  // refuses; and a sha256 without a blob key was dropped.
  Result unhashed = r;
  unhashed.sha256.clear();
  EXPECT_EQ(*ParseResult(ResultToJson(unhashed).dump()), unhashed);
  Result hash_only = evaluated;
  hash_only.sha256 = std::string(64, 'e');
  EXPECT_EQ(*ParseResult(ResultToJson(hash_only).dump()), hash_only);
  json spoofed = ResultToJson(r);
  spoofed["worker_id"] = 9;
  EXPECT_EQ(ParseResult(spoofed.dump()).status().message(), "unknown field 'worker_id'");
  json many = ResultToJson(r);
  for (int i = 0; i < 16; ++i) many["metrics"]["m" + std::to_string(i)] = i;
  EXPECT_EQ(ParseResult(many.dump()).status().message(), "'metrics' has 17 fields, at most 16 are allowed");
  EXPECT_THAT(std::string(ParseResult("{").status().message()), HasSubstr("request body is not valid JSON: "));
}

// The trainer's metrics as worker/task_translation.cc sends them pass; anything else in `metrics` is refused by name.
TEST(ResultTest, MetricsHaveASchema) {
  const json validation = {{"num_examples", 30}, {"num_counted", 30}, {"loss", 0.7},
                           {"perplexity", 2.01}, {"accuracy", 0.8},   {"exact_match", nullptr}};
  Result r{.job_id = 3, .round = 2, .attempt = 1, .sample_count = 120};
  r.metrics = {{"validation_before", validation},
               {"validation_after", nullptr},
               {"steps", 10},
               {"examples_seen", 1200},
               {"tokens_seen", 0},
               {"wall_s", 1.5}};
  EXPECT_EQ(*ParseResult(ResultToJson(r).dump()), r);

  auto problem = [&](const json& metrics) {
    json body = ResultToJson(r);
    body["metrics"] = metrics;
    return std::string(ParseResult(body.dump()).status().message());
  };
  EXPECT_EQ(problem({{"steps", "ten"}}), "'metrics.steps' must be a finite number or null, got string");
  EXPECT_EQ(problem({{"steps", json::array({1})}}), "'metrics.steps' must be a finite number or null, got array");
  EXPECT_EQ(problem({{"rows", 1}}), "unknown field 'metrics.rows'");
  EXPECT_EQ(problem({{"validation_after", {{"loss", {{"x", 1}}}}}}),
            "'metrics.validation_after.loss' must be a finite number or null, got object");
  EXPECT_EQ(problem({{"validation_after", {{"lost", 1}}}}), "unknown field 'metrics.validation_after.lost'");
  EXPECT_EQ(problem({{"validation_before", 1}}),
            "'metrics.validation_before' must be an object of at most 6 numbers, got number");
  // JSON has no infinity: a number too large for a double is refused by the parser.
  EXPECT_THAT(
      std::string(
          ParseResult(R"({"job_id": 3, "round": 2, "attempt": 1, "metrics": {"wall_s": 1e999}})").status().message()),
      HasSubstr("number overflow parsing '1e999'"));
}

// The body that crashed the coordinator (a valid worker token was all it took): ~200,000 nested arrays in metrics,
// 400 KB, under the 1 MiB body cap. Refused before it is parsed, for every message read from outside.
TEST(ResultTest, DeeplyNestedBodiesAreRefusedBeforeParsing) {
  const std::string nested = std::string(200'000, '[') + std::string(200'000, ']');
  const std::string body = R"({"job_id": 3, "round": 2, "attempt": 1, "metrics": {"steps": )" + nested + "}}";
  EXPECT_EQ(ParseResult(body).status().message(), "request body nests deeper than 64 levels (at byte 123)");
  EXPECT_EQ(ParseProgress(body).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHello(body).status().code(), StatusCode::kInvalidArgument);
}

TEST(FailureTest, RoundTripsAndBoundsTheReason) {
  Failure f{.job_id = 3, .round = 2, .attempt = 1, .reason = "trainer crashed"};
  EXPECT_EQ(FailureToJson(f), (json{{"job_id", 3}, {"round", 2}, {"attempt", 1}, {"reason", "trainer crashed"}}));
  EXPECT_EQ(*ParseFailure(FailureToJson(f).dump()), f);
  f.reason = std::string(kMaxReasonBytes + 1, 'x');
  EXPECT_EQ(ParseFailure(FailureToJson(f).dump()).status().message(), "'reason' must be 1..2000 bytes");
  EXPECT_EQ(ParseFailure(R"({"job_id": 3, "round": 2, "attempt": 1})").status().message(), "missing field 'reason'");
}

}  // namespace
}  // namespace parsyn::protocol
