#include "worker/trainer_supervisor.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "base/sha256.h"
#include "protocol/field_reader.h"
#include "weights/safetensors.h"
#include "weights/safetensors_stream_check.h"

namespace parsyn::worker {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr size_t kMaxResultBytes = 1 << 20;
constexpr size_t kMaxDescribeBytes = 64 * 1024;
constexpr size_t kQuotedLineBytes = 120;

// `line` for a message: cut, with control characters shown as spaces.
std::string QuotedLine(std::string_view line) {
  std::string text(line.substr(0, kQuotedLineBytes));
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return protocol::FieldReader::Quoted(text) + (line.size() > kQuotedLineBytes ? "…" : "");
}

fs::path Resolve(const fs::path& dir, const std::string& path) {
  const fs::path p(path);
  return p.is_absolute() ? p : dir / p;
}

// Stops `run` once `deadline` passes (timed_out then reads true), until Finish. One thread, waiting on a condition.
class DeadlineWatch {
 public:
  DeadlineWatch(TrainerRun& run, std::chrono::steady_clock::time_point deadline) {
    if (deadline == std::chrono::steady_clock::time_point::max()) return;
    thread_ = std::thread([this, &run, deadline] {
      std::unique_lock lock(mutex_);
      if (!cv_.wait_until(lock, deadline, [this] { return finished_; })) {
        timed_out_ = true;
        run.Terminate();
      }
    });
  }
  ~DeadlineWatch() { Finish(); }
  void Finish() {
    {
      std::lock_guard lock(mutex_);
      finished_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  bool timed_out() {
    std::lock_guard lock(mutex_);
    return timed_out_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool finished_ = false;
  bool timed_out_ = false;
  std::thread thread_;
};

// What the trainer said on stdout.
struct StdoutEvents {
  std::optional<protocol::TrainerDone> done;
  std::optional<protocol::TrainerError> error;
  Status broken;  // the first `stdout` or `event` rule broken
};

StdoutEvents ReadEvents(TrainerRun& run, std::string_view trainer, const TrainerRunOptions& options) {
  StdoutEvents seen;
  int line_number = 0;
  while (std::optional<std::string> line = run.ReadLine()) {
    ++line_number;
    if (!seen.broken.ok()) continue;  // drain what is left while the trainer stops
    if (line->empty() || *line == "\r") continue;
    std::optional<json> object = protocol::ParseEventObject(*line);
    if (!object) {
      seen.broken = TrainerRuleError(trainer, "stdout",
                                     "line " + std::to_string(line_number) +
                                         " is not a JSON event: " + QuotedLine(*line) + " (print logs to stderr)");
      run.Terminate();
      continue;
    }
    StatusOr<protocol::TrainerEvent> event = protocol::ParseTrainerEvent(*object);
    if (!event.ok()) {
      seen.broken =
          TrainerRuleError(trainer, "event", "line " + std::to_string(line_number) + ": " + event.status().message());
      run.Terminate();
      continue;
    }
    if (auto* progress = std::get_if<protocol::TrainerProgress>(&*event)) {
      if (options.on_progress) options.on_progress(*progress);
    } else if (auto* done = std::get_if<protocol::TrainerDone>(&*event)) {
      seen.done = std::move(*done);
    } else if (auto* error = std::get_if<protocol::TrainerError>(&*event)) {
      seen.error = std::move(*error);
    }
  }
  return seen;
}

// The update's header against the initial weights' header (`layout`), then its values (`finite`, `update`) and
// sha256 in one streamed pass.
StatusOr<std::string> CheckUpdateFile(std::string_view trainer, const fs::path& update, const fs::path& initial) {
  std::error_code ec;
  const uint64_t size = fs::file_size(update, ec);
  if (ec) return TrainerRuleError(trainer, "update", "no update was written to " + update.filename().string());
  std::ifstream in(update, std::ios::binary);
  auto read_from = [](std::ifstream& file) {
    return [&file](std::span<std::byte> buffer) -> StatusOr<size_t> {
      file.read(reinterpret_cast<char*>(buffer.data()), static_cast<std::streamsize>(buffer.size()));
      return static_cast<size_t>(file.gcount());
    };
  };
  StatusOr<weights::SafetensorsLayout> got = weights::ReadSafetensorsLayout(size, read_from(in));
  if (!got.ok()) {
    return TrainerRuleError(trainer, "update",
                            update.filename().string() + " is not a valid safetensors file: " + got.status().message());
  }
  std::ifstream initial_in(initial, std::ios::binary);
  StatusOr<weights::SafetensorsLayout> want =
      weights::ReadSafetensorsLayout(fs::file_size(initial, ec), read_from(initial_in));
  if (ec || !want.ok()) {
    return InternalError("cannot read the initial weights " + initial.string() + ": " +
                         (ec ? ec.message() : want.status().message()));
  }
  if (Status layout = weights::CheckLayoutMatches(want->tensors, got->tensors); !layout.ok()) {
    return TrainerRuleError(trainer, "layout",
                            layout.message() + " (the update must have the initial weights' layout)");
  }
  in.clear();
  in.seekg(0);
  weights::SafetensorsStreamChecker checker;
  Sha256 hash;
  std::vector<std::byte> buffer(1 << 20);
  while (in) {
    in.read(reinterpret_cast<char*>(buffer.data()), static_cast<std::streamsize>(buffer.size()));
    const std::span<const std::byte> chunk(buffer.data(), static_cast<size_t>(in.gcount()));
    checker.Update(chunk);
    hash.Update(std::string_view(reinterpret_cast<const char*>(chunk.data()), chunk.size()));
  }
  if (Status values = checker.Finish(); !values.ok()) {
    const bool non_finite = values.message().find("non-finite") != std::string::npos;
    return TrainerRuleError(trainer, non_finite ? "finite" : "update", values.message());
  }
  return hash.HexDigest();
}

}  // namespace

std::string TrainerCommand::CommandLine() const {
  std::string line;
  for (const std::string& word : argv) {
    if (!line.empty()) line += ' ';
    if (!word.empty() && word.find_first_of(" \t'\"\\") == std::string::npos) {
      line += word;
      continue;
    }
    line += '\'';
    for (char c : word) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += '\'';
  }
  return line;
}

StatusOr<std::vector<std::string>> SplitCommandLine(std::string_view line) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::exchange(word, {}));
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      if (++i == line.size()) return InvalidArgumentError("the command ends with a lone backslash");
      word += line[i];
    } else if (c == '\'') {
      const size_t end = line.find('\'', i + 1);
      if (end == std::string_view::npos) return InvalidArgumentError("the command has an unterminated ' quote");
      word += line.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      for (++i; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == '"' || line[i + 1] == '\\')) ++i;
        word += line[i];
      }
      if (i == line.size()) return InvalidArgumentError("the command has an unterminated \" quote");
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  if (words.empty()) return InvalidArgumentError("the command is empty");
  return words;
}

StatusOr<fs::path> FindProgram(std::string_view name) {
  if (name.find('/') != std::string_view::npos) {
    if (::access(std::string(name).c_str(), X_OK) != 0) {
      return NotFoundError(std::string(name) + " does not exist or is not executable");
    }
    return fs::path(name);
  }
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, end - start);
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) return candidate;
    start = end + 1;
  }
  return NotFoundError("no program '" + std::string(name) + "' in $PATH (" + dirs + ")");
}

StatusOr<TrainerCommand> ParseTrainerCommand(std::string_view spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string_view::npos) {
    return InvalidArgumentError("--trainer takes NAME=COMMAND (e.g. tabular=\"python3 train.py\"), got '" +
                                std::string(spec) + "'");
  }
  TrainerCommand trainer{.name = std::string(spec.substr(0, eq)), .argv = {}};
  if (!protocol::IsTrainerName(trainer.name)) {
    return InvalidArgumentError("--trainer " + std::string(spec) + ": the name '" + trainer.name +
                                "' must be 1..64 letters, digits, '_', '.' or '-', starting with a letter or digit");
  }
  StatusOr<std::vector<std::string>> words = SplitCommandLine(spec.substr(eq + 1));
  if (!words.ok()) return words.status().WithContext("--trainer " + trainer.name);
  StatusOr<fs::path> program = FindProgram((*words)[0]);
  if (!program.ok()) return program.status().WithContext("--trainer " + trainer.name);
  (*words)[0] = program->string();
  trainer.argv = std::move(*words);
  return trainer;
}

Status TrainerRuleError(std::string_view trainer, std::string_view rule, std::string_view detail) {
  return InvalidArgumentError("trainer '" + std::string(trainer) + "' broke rule '" + std::string(rule) +
                              "': " + std::string(detail));
}

StatusOr<protocol::TrainerDescription> TrainerSupervisor::Describe(const TrainerCommand& trainer,
                                                                   std::chrono::milliseconds timeout) {
  std::vector<std::string> argv = trainer.argv;
  argv.push_back("--describe");
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<TrainerRun> run, launcher_.Start(argv));
  DeadlineWatch watch(*run, std::chrono::steady_clock::now() + timeout);
  std::string text;
  while (std::optional<std::string> line = run->ReadLine()) {
    if (text.size() < kMaxDescribeBytes) text += *line + "\n";
  }
  const int code = run->Wait();
  watch.Finish();
  const std::string what = "trainer '" + trainer.name + "' (" + trainer.CommandLine() + " --describe)";
  if (watch.timed_out()) {
    return InvalidArgumentError(what + " did not answer within " + std::to_string(timeout.count() / 1000) + " s");
  }
  if (code != 0) return InvalidArgumentError(what + " exited with status " + std::to_string(code));
  const json described = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (described.is_discarded()) {
    return InvalidArgumentError(what + " did not print one JSON object: " + QuotedLine(text));
  }
  StatusOr<protocol::TrainerDescription> description = protocol::ParseTrainerDescription(described);
  if (!description.ok()) return InvalidArgumentError(what + ": " + description.status().message());
  return description;
}

StatusOr<std::vector<DescribedTrainer>> DescribeTrainers(TrainerSupervisor& supervisor,
                                                         const std::vector<TrainerCommand>& trainers) {
  std::vector<DescribedTrainer> described;
  for (const TrainerCommand& trainer : trainers) {
    PARSYN_ASSIGN_OR_RETURN(protocol::TrainerDescription d, supervisor.Describe(trainer));
    described.push_back({.command = trainer, .description = std::move(d)});
  }
  return described;
}

StatusOr<TrainerOutput> TrainerSupervisor::Run(const TrainerCommand& trainer, const fs::path& task_file,
                                               const protocol::TrainerTask& task, const TrainerRunOptions& options) {
  if (options.stop.stop_requested()) return CancelledError("trainer '" + trainer.name + "' not started: stopped");
  std::vector<std::string> argv = trainer.argv;
  argv.push_back("run");
  argv.push_back(task_file.string());
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<TrainerRun> run, launcher_.Start(argv));
  std::stop_callback on_stop(options.stop, [&run] { run->Terminate(); });
  DeadlineWatch watch(*run, options.deadline);
  StdoutEvents seen = ReadEvents(*run, trainer.name, options);
  const int code = run->Wait();
  watch.Finish();
  if (options.stop.stop_requested()) return CancelledError("trainer '" + trainer.name + "' stopped");
  if (watch.timed_out()) {
    return DeadlineExceededError("trainer '" + trainer.name +
                                 "' broke rule 'timeout': still running at the task's deadline; stopped");
  }
  if (!seen.broken.ok()) return seen.broken;
  if (code != 0) {
    const std::string how = code > 128 ? "was killed by signal " + std::to_string(code - 128)
                                       : "exited with status " + std::to_string(code);
    if (!seen.error) return TrainerRuleError(trainer.name, "exit", "it " + how + " without an error event");
    // A trainer that failed and said why: its own words (invalid data, out of memory, ...).
    std::string message =
        "trainer '" + trainer.name + "' " + how + ": " + seen.error->code + ": " + seen.error->message;
    if (code == protocol::kTrainerExitOutOfMemory) return ResourceExhaustedError(std::move(message));
    return FailedPreconditionError(std::move(message));
  }
  if (!seen.done) return TrainerRuleError(trainer.name, "done", "it exited 0 without a done event");
  return CheckTrainerOutput(trainer.name, task, task_file.parent_path());
}

StatusOr<TrainerOutput> CheckTrainerOutput(std::string_view trainer, const protocol::TrainerTask& task,
                                           const fs::path& task_dir) {
  TrainerOutput output;
  const fs::path result_file = Resolve(task_dir, task.output_result);
  std::ifstream in(result_file, std::ios::binary);
  if (!in) return TrainerRuleError(trainer, "result", "no result was written to " + result_file.filename().string());
  std::string text(kMaxResultBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxResultBytes) {
    return TrainerRuleError(trainer, "result", "the result file is over " + std::to_string(kMaxResultBytes) + " bytes");
  }
  StatusOr<json> parsed = protocol::ParseJsonText(text, "the result file");
  if (!parsed.ok()) return TrainerRuleError(trainer, "result", parsed.status().message());
  StatusOr<protocol::TrainerResult> result = protocol::ParseTrainerResult(*parsed);
  if (!result.ok()) return TrainerRuleError(trainer, "result", result.status().message());
  output.result = std::move(*result);
  if (task.kind != protocol::TaskKind::kTrain) return output;
  output.update = Resolve(task_dir, task.output_weights);
  PARSYN_ASSIGN_OR_RETURN(output.update_sha256,
                          CheckUpdateFile(trainer, output.update, Resolve(task_dir, task.initial_weights)));
  return output;
}

}  // namespace parsyn::worker
