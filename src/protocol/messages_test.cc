#include "protocol/messages.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace parsyn::protocol {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

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
      {"global_weights", {{"url", "http://c/blobs/g?sig=1"}, {"sha256", "ab"}, {"size_bytes", 1234}, {"round", 1}}},
      {"data",
       {{"format", "jsonl"},
        {"kind", "text"},
        {"train_url", "http://c/blobs/t?sig=2"},
        {"train_rows", 90},
        {"validation_url", "http://c/blobs/v?sig=3"},
        {"validation_rows", 10}}},
      {"model",
       {{"id", 7},
        {"name", "tiny"},
        {"model_type", "llama"},
        {"files",
         {{{"path", "config.json"}, {"url", "http://c/blobs/m?sig=4"}, {"sha256", "cd"}, {"size_bytes", 5}}}}}},
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
  EXPECT_EQ(TaskToJson(*task).dump(), wire.dump());

  // The directory store's grant (one signed PUT) and S3's single PUT with its headers.
  json single = wire;
  single["update_upload"] = {{"blob_key", "k"}, {"max_size_bytes", 9}, {"url", "http://c/blobs/k?sig=5"}};
  EXPECT_EQ(TaskToJson(*ParseTask(single)).dump(), single.dump());
  single["update_upload"]["headers"] = {{"If-None-Match", "*"}};
  EXPECT_EQ(TaskToJson(*ParseTask(single)).dump(), single.dump());
  json evaluate = wire;
  evaluate["kind"] = "evaluate";
  evaluate.erase("update_upload");
  EXPECT_EQ(TaskToJson(*ParseTask(evaluate)).dump(), evaluate.dump());
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

TEST(HelloTest, RoundTripsAndAcceptsAnEmptyBody) {
  Hello hello{.device = "cuda:0", .version = "parsyn-worker 0.1.0"};
  EXPECT_EQ(HelloToJson(hello), (json{{"device", "cuda:0"}, {"version", "parsyn-worker 0.1.0"}}));
  EXPECT_EQ(*ParseHello(HelloToJson(hello).dump()), hello);
  EXPECT_EQ(*ParseHello(""), Hello{});
  EXPECT_EQ(ParseHello(R"({"device": 1, "gpu": "a"})").status().message(),
            "unknown field 'gpu'; 'device' must be a string, got number");

  HelloAnswer answer{.worker_id = 4,
                     .session_id = "pss_1",
                     .heartbeat_interval_ms = 1000,
                     .heartbeat_timeout_ms = 9000,
                     .max_poll_wait_ms = 200};
  EXPECT_EQ(*ParseHelloAnswer(HelloAnswerToJson(answer)), answer);
  auto minimal = ParseHelloAnswer(json{{"session_id", "s1"}});
  ASSERT_TRUE(minimal.ok());
  EXPECT_EQ(minimal->heartbeat_interval_ms, 5'000);
  EXPECT_EQ(minimal->max_poll_wait_ms, 30'000);
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
  json spoofed = ResultToJson(r);
  spoofed["worker_id"] = 9;
  EXPECT_EQ(ParseResult(spoofed.dump()).status().message(), "unknown field 'worker_id'");
  json many = ResultToJson(r);
  for (int i = 0; i < 65; ++i) many["metrics"]["m" + std::to_string(i)] = i;
  EXPECT_EQ(ParseResult(many.dump()).status().message(), "'metrics' has 66 fields, at most 64 are allowed");
  EXPECT_EQ(ParseResult("{").status().message(), "request body is not valid JSON");
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
