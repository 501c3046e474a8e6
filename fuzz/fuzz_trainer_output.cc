// libFuzzer entry for what Parsyn reads from a trainer under the trainer contract (docs/trainer-contract.md) and from
// a custom model folder: a line of its stdout (ParseEventObject, then ParseTrainerEvent), its result file
// (ParseTrainerResult), its --describe answer (ParseTrainerDescription), a task file (ParseTrainerTask, as a trainer
// reads it) and parsyn_model.json (ParseModelManifest, read from an upload). The first byte picks which, the rest is
// the text. Besides the sanitizers' checks it asserts the readers' contract: a rejection is InvalidArgument with a
// message, never a throw, and whatever is accepted is written back and read again to the same value.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "protocol/field_reader.h"
#include "protocol/model_manifest.h"
#include "protocol/trainer_events.h"
#include "protocol/trainer_task.h"

namespace {

using nlohmann::json;

[[noreturn]] void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_trainer_output: %s %s\n", what, detail.c_str());
  std::abort();
}

void CheckRejection(const parsyn::Status& s) {
  if (s.code() != parsyn::StatusCode::kInvalidArgument) Fail("rejection is not InvalidArgument:", s.ToString());
  if (s.message().empty()) Fail("rejection without a message");
}

// Reads `text` as JSON the way the worker does for files (ParseJsonText: nesting and duplicate keys checked).
std::optional<json> ReadJson(std::string_view text) {
  parsyn::StatusOr<json> parsed = parsyn::protocol::ParseJsonText(text, "input");
  if (!parsed.ok()) {
    CheckRejection(parsed.status());
    return std::nullopt;
  }
  return *std::move(parsed);
}

template <typename Message, typename Parse, typename Write>
void RoundTrip(const json& object, Parse parse, Write write) {
  parsyn::StatusOr<Message> message = parse(object);
  if (!message.ok()) {
    CheckRejection(message.status());
    return;
  }
  const std::string written = write(*message).dump();
  parsyn::StatusOr<Message> again = parse(json::parse(written));
  if (!again.ok()) Fail("the written form of an accepted value does not parse:", again.status().ToString());
  if (!(*again == *message)) Fail("the written form parses to a different value", written);
}

void StdoutLine(std::string_view line) {
  using namespace parsyn::protocol;
  std::optional<json> object = ParseEventObject(line);
  if (!object) return;  // not an event: the `stdout` rule
  parsyn::StatusOr<TrainerEvent> event = ParseTrainerEvent(*object);
  if (!event.ok()) {
    CheckRejection(event.status());
    return;
  }
  json written;
  if (const auto* p = std::get_if<TrainerProgress>(&*event)) written = TrainerProgressToJson(*p);
  if (const auto* d = std::get_if<TrainerDone>(&*event)) written = TrainerDoneToJson(*d);
  if (const auto* e = std::get_if<TrainerError>(&*event)) written = TrainerErrorToJson(*e);
  if (written.is_null()) return;  // another event: ignored
  std::optional<json> again_object = ParseEventObject(written.dump());
  if (!again_object) Fail("a written event is not an event line", written.dump());
  parsyn::StatusOr<TrainerEvent> again = ParseTrainerEvent(*again_object);
  if (!again.ok() || !(*again == *event)) Fail("a written event reads back differently", written.dump());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parsyn::protocol;
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0: StdoutLine(text); break;
    case 1:
      if (std::optional<json> j = ReadJson(text)) {
        RoundTrip<TrainerResult>(*j, ParseTrainerResult, TrainerResultToJson);
      }
      break;
    case 2:
      if (std::optional<json> j = ReadJson(text)) {
        RoundTrip<TrainerDescription>(*j, ParseTrainerDescription, TrainerDescriptionToJson);
      }
      break;
    case 3:
      if (std::optional<json> j = ReadJson(text)) {
        RoundTrip<TrainerTask>(*j, ParseTrainerTask, TrainerTaskToJson);
      }
      break;
    default: {
      parsyn::StatusOr<ModelManifest> manifest = ParseModelManifest(text);
      if (!manifest.ok()) CheckRejection(manifest.status());
      break;
    }
  }
  return 0;
}
