// libFuzzer entry for the request bodies the coordinator's routes parse (the job spec has fuzz_job_spec): the worker
// protocol's hello, heartbeat (and goodbye, the same body), progress, result and failure; the admin routes' model
// and worker registrations; and the model files a model registration reads from its staged uploads (config.json,
// tabular_model.json, model.safetensors.index.json). The first byte picks the parser, the rest is the body as the
// route receives it. Besides the sanitizers' checks it asserts each reader's contract: a rejection is InvalidArgument
// with a message, and what is accepted is written back and read again to the same value (where a writer exists).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "coordinator/api_json.h"
#include "data/llama_config.h"
#include "data/tabular_model_file.h"
#include "protocol/messages.h"
#include "weights/safetensors.h"

namespace {

using nlohmann::json;

[[noreturn]] void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_route_bodies: %s %s\n", what, detail.c_str());
  std::abort();
}

// A rejection says what is wrong, as a 400 (InvalidArgument) whose message names it.
void CheckRejection(const parsyn::Status& status) {
  if (status.code() != parsyn::StatusCode::kInvalidArgument)
    Fail("rejection is not InvalidArgument", status.ToString());
  if (status.message().empty()) Fail("rejection without a message");
}

// Parse, write back as the other side sends it (JSON text), parse again: the same message.
template <typename Message, typename Parse, typename Write>
void RoundTrip(std::string_view body, Parse parse, Write write) {
  parsyn::StatusOr<Message> message = parse(body);
  if (!message.ok()) return CheckRejection(message.status());
  const std::string written = write(*message);
  parsyn::StatusOr<Message> again = parse(written);
  if (!again.ok()) Fail("the written form of an accepted body does not parse:", again.status().ToString());
  if (!(*again == *message)) Fail("the written form parses to a different value", written);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parsyn;
  using namespace parsyn::protocol;
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 10) {
    case 0:  // POST /api/v1/worker/hello
      RoundTrip<Hello>(
          body, [](std::string_view b) { return ParseHello(b); }, [](const Hello& m) { return HelloToJson(m).dump(); });
      break;
    case 1:  // POST /api/v1/worker/heartbeat and /goodbye
      RoundTrip<Heartbeat>(
          body, [](std::string_view b) { return ParseHeartbeat(b); },
          [](const Heartbeat& m) { return HeartbeatToJson(m).dump(); });
      break;
    case 2:  // POST /api/v1/worker/progress
      RoundTrip<Progress>(
          body, [](std::string_view b) { return ParseProgress(b); },
          [](const Progress& m) { return ProgressToJson(m).dump(); });
      break;
    case 3:  // POST /api/v1/worker/result
      RoundTrip<Result>(
          body, [](std::string_view b) { return ParseResult(b); },
          [](const Result& m) { return ResultToJson(m).dump(); });
      break;
    case 4:  // POST /api/v1/worker/failure
      RoundTrip<Failure>(
          body, [](std::string_view b) { return ParseFailure(b); },
          [](const Failure& m) { return FailureToJson(m).dump(); });
      break;
    case 5: {  // POST /api/v1/models: every file accepted has a valid path and an upload's key
      StatusOr<storage::Model> model = coordinator::ParseModelBody(body);
      if (!model.ok()) {
        CheckRejection(model.status());
        return 0;
      }
      if (model->name.empty() || model->files.empty()) Fail("accepted a model without a name or files");
      for (const storage::ModelFile& f : model->files) {
        if (!coordinator::ValidateModelFilePath(f.path).ok()) Fail("accepted a bad model file path", f.path);
        if (!f.blob_key.starts_with("uploads/") || !coordinator::ValidateUploadId(f.blob_key.substr(8)).ok()) {
          Fail("accepted a file that is not an upload", f.blob_key);
        }
      }
      break;
    }
    case 6:  // POST /api/v1/workers
      RoundTrip<coordinator::WorkerRegistration>(
          body, [](std::string_view b) { return coordinator::ParseWorkerRegistration(b); },
          [](const coordinator::WorkerRegistration& r) {
            return json{{"name", r.name}, {"kind", storage::ToString(r.kind)}}.dump();
          });
      break;
    case 7: {  // a model's config.json: what is accepted is written back (LlamaConfigToJson) and read the same
      StatusOr<data::LlamaConfig> config = data::ParseLlamaConfig(body);
      if (!config.ok()) {
        CheckRejection(config.status());
        return 0;
      }
      const std::string written = data::LlamaConfigToJson(*config);
      StatusOr<data::LlamaConfig> again = data::ParseLlamaConfig(written);
      if (!again.ok()) Fail("the written config.json does not parse:", again.status().ToString());
      if (data::LlamaConfigToJson(*again) != written) Fail("the written config.json reads differently", written);
      break;
    }
    case 8: {  // a tabular model's tabular_model.json: what is accepted meets the tabular model's rules
      StatusOr<data::TabularModelFile> model = data::ParseTabularModelFile(body);
      if (!model.ok()) {
        CheckRejection(model.status());
        return 0;
      }
      if (!data::CheckTabularModel(*model).ok()) Fail("accepted a tabular model that breaks its rules");
      break;
    }
    default: {  // model.safetensors.index.json: every shard named is a plain file name
      auto index = weights::ParseSafetensorsIndex(body);
      if (!index.ok()) {
        CheckRejection(index.status());
        return 0;
      }
      for (const auto& [shard, tensors] : *index) {
        if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
          Fail("accepted a shard that is not a plain file name", shard);
        }
      }
      break;
    }
  }
  return 0;
}
