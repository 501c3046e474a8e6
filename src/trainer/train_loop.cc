#include "trainer/train_loop.h"

#include <ATen/autocast_mode.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "data/dataset.h"
#include "protocol/field_reader.h"

namespace parsyn::trainer {
namespace {

using Clock = std::chrono::steady_clock;

// Turns autocast on for this scope (forward passes only; backward runs outside, as in PyTorch's recipe) and restores
// the previous state after. The cast cache is cleared when the outermost scope ends, as torch.autocast does.
class AutocastScope {
 public:
  AutocastScope(MixedPrecision precision, torch::Device device) {
    if (precision == MixedPrecision::kNo) return;
    active_ = true;
    cuda_ = device.is_cuda();
    const at::ScalarType dtype = precision == MixedPrecision::kBf16 ? at::kBFloat16 : at::kHalf;
    if (cuda_) {
      previous_enabled_ = at::autocast::is_enabled();
      previous_dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_enabled(true);
      at::autocast::set_autocast_gpu_dtype(dtype);
    } else {
      previous_enabled_ = at::autocast::is_cpu_enabled();
      previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(dtype);
    }
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    if (cuda_) {
      at::autocast::set_enabled(previous_enabled_);
      at::autocast::set_autocast_gpu_dtype(previous_dtype_);
    } else {
      at::autocast::set_cpu_enabled(previous_enabled_);
      at::autocast::set_autocast_cpu_dtype(previous_dtype_);
    }
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

}  // namespace

Status StatusFromTorchException(const std::exception& e, std::string_view doing) {
  std::string message = e.what();
  // Keep the first line: libtorch appends a C++ stack trace that helps nobody reading a task's failure reason.
  if (auto newline = message.find('\n'); newline != std::string::npos) message.resize(newline);
  const bool oom =
      dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr || dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
      message.find("out of memory") != std::string::npos || message.find("not enough memory") != std::string::npos;
  if (oom) return ResourceExhaustedError("out of memory while " + std::string(doing) + ": " + message);
  return InternalError(std::string(doing) + " failed: " + message);
}

namespace {

Status CheckPrecision(MixedPrecision precision, torch::Device device) {
  if (precision == MixedPrecision::kFp16 && !device.is_cuda()) {
    return InvalidArgumentError("config.mixed_precision: fp16 needs a CUDA device (this run is on " + device.str() +
                                "); use \"bf16\" or \"no\" on CPU");
  }
  return Status::Ok();
}

uint64_t EpochSeed(uint64_t seed, int64_t epoch) {
  // A different, well-mixed stream per epoch; SplitMix64 scrambles the sum.
  return data::SplitMix64(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1)).Next();
}

// fp16 dynamic loss scaling, as torch.cuda.amp.GradScaler does it: multiply the loss by `scale` before backward,
// divide the gradients by it before clipping; on non-finite gradients skip the step and halve the scale; after
// kGrowthInterval clean steps double it.
class LossScaler {
 public:
  explicit LossScaler(bool enabled) : enabled_(enabled) {}
  double scale() const { return enabled_ ? scale_ : 1.0; }
  void Unscale(const std::vector<torch::Tensor>& params) const {
    if (!enabled_) return;
    torch::NoGradGuard no_grad;
    for (const auto& p : params) {
      if (p.grad().defined()) p.grad().mul_(1.0 / scale_);
    }
  }
  // Returns whether the step should be applied.
  bool Update(bool grads_finite) {
    if (!enabled_) return true;
    if (!grads_finite) {
      scale_ = std::max(scale_ / 2, 1.0);
      clean_steps_ = 0;
      return false;
    }
    if (++clean_steps_ >= kGrowthInterval) {
      scale_ *= 2;
      clean_steps_ = 0;
    }
    return true;
  }

 private:
  static constexpr int64_t kGrowthInterval = 2000;
  bool enabled_;
  double scale_ = 65536.0;
  int64_t clean_steps_ = 0;
};

}  // namespace

StatusOr<StepPlan> PlanSteps(const protocol::TrainingConfig& config, int64_t num_examples,
                             std::optional<int64_t> max_steps) {
  if (num_examples < 1) return InvalidArgumentError("no training examples (is the validation fraction too large?)");
  if (max_steps && *max_steps < 0) return InvalidArgumentError("steps must be >= 0, got " + std::to_string(*max_steps));
  StepPlan plan;
  const int64_t micro_batches = (num_examples + config.batch_size - 1) / config.batch_size;
  plan.steps_per_epoch = (micro_batches + config.gradient_accumulation_steps - 1) / config.gradient_accumulation_steps;
  plan.total_steps = max_steps ? *max_steps : config.epochs * plan.steps_per_epoch;
  return plan;
}

double LearningRateAt(const protocol::TrainingConfig& config, int64_t step, int64_t total_steps) {
  const double peak = config.learning_rate;
  if (step < config.warmup_steps)
    return peak * static_cast<double>(step + 1) / static_cast<double>(config.warmup_steps);
  const int64_t decay_steps = total_steps - config.warmup_steps;
  if (config.lr_scheduler == LrScheduler::kConstant || decay_steps <= 0) return peak;
  const double progress =
      std::clamp(static_cast<double>(step - config.warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  if (config.lr_scheduler == LrScheduler::kLinear) return peak * (1.0 - progress);
  return peak * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

StatusOr<torch::Device> ParseDevice(std::string_view name) {
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (name != "cuda" && !name.starts_with("cuda:")) {
    return InvalidArgumentError("device \"" + std::string(name) + "\": expected cpu, cuda or cuda:N");
  }
  int64_t index = 0;
  if (name.starts_with("cuda:")) {
    const std::string digits(name.substr(5));
    if (digits.empty() || digits.size() > 4 || digits.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgumentError("device \"" + std::string(name) + "\": expected cuda:N with N a GPU index");
    }
    index = std::stoll(digits);
  }
  if (!torch::cuda::is_available()) {
    return FailedPreconditionError("device \"" + std::string(name) +
                                   "\": CUDA is not available (this libtorch was built without CUDA, or no GPU is "
                                   "visible); use --device cpu");
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  if (index >= count) {
    return FailedPreconditionError("device \"" + std::string(name) + "\": only " + std::to_string(count) +
                                   " CUDA device(s) visible");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

torch::Tensor ProximalTerm(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& anchors,
                           double mu) {
  torch::Tensor squared_distance = torch::zeros({}, anchors.front().options());
  for (size_t i = 0; i < params.size(); ++i) {
    squared_distance = squared_distance + (params[i].to(torch::kFloat32) - anchors[i]).square().sum();
  }
  return squared_distance * (mu / 2);
}

namespace {

// AdamW's parameter groups: the parameters the model decays with config.weight_decay, and the others with none.
std::vector<torch::optim::OptimizerParamGroup> ParamGroups(TrainableModel& model,
                                                           const std::vector<torch::Tensor>& params,
                                                           const std::vector<std::string>& names,
                                                           const protocol::TrainingConfig& config) {
  std::vector<torch::Tensor> decayed;
  std::vector<torch::Tensor> not_decayed;
  for (size_t i = 0; i < params.size(); ++i) {
    (model.UsesWeightDecay(names[i]) ? decayed : not_decayed).push_back(params[i]);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) {
    groups.emplace_back(decayed,
                        std::make_unique<torch::optim::AdamWOptions>(
                            torch::optim::AdamWOptions(config.learning_rate).weight_decay(config.weight_decay)));
  }
  if (!not_decayed.empty()) {
    groups.emplace_back(not_decayed, std::make_unique<torch::optim::AdamWOptions>(
                                         torch::optim::AdamWOptions(config.learning_rate).weight_decay(0.0)));
  }
  return groups;
}

// Frozen fp32 copies of the parameters, on their device: FedProx's anchor, the weights a run starts from.
std::vector<torch::Tensor> FrozenCopies(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> anchors;
  for (const auto& p : params) anchors.push_back(p.detach().to(torch::kFloat32, false, /*copy=*/true));
  return anchors;
}

// What one optimizer step's micro-batches came to.
struct StepTotals {
  double loss = 0;  // the mean of the micro-batches' losses
  int64_t tokens = 0;
  int64_t examples = 0;
};

// Runs forward and backward over one optimizer step's micro-batches, accumulating their gradients: each loss scaled
// by `scaler` and averaged, plus FedProx's proximal term against `anchors` (if any) once. `step` is 0-based.
StatusOr<StepTotals> AccumulateGradients(TrainableModel& model, const ExampleSet& examples,
                                         const std::vector<std::span<const int64_t>>& micro_batches,
                                         const TrainOptions& options, const LossScaler& scaler,
                                         const std::vector<torch::Tensor>& params,
                                         const std::vector<torch::Tensor>& anchors, int64_t step) {
  const protocol::TrainingConfig& config = options.config;
  const torch::Device device = model.device();
  StepTotals totals;
  for (const auto& indices : micro_batches) {
    if (options.stop.stop_requested())
      return CancelledError("training stopped on request at step " + std::to_string(step + 1));
    const Batch batch = examples.MakeBatch(indices, device);
    StepOutput out;
    {
      AutocastScope autocast(options.autocast ? config.mixed_precision : MixedPrecision::kNo, device);
      out = model.Forward(batch);
    }
    const double loss_value = out.loss.item<double>();
    if (!std::isfinite(loss_value) && config.mixed_precision != MixedPrecision::kFp16) {
      return InvalidArgumentError("the training loss became " + std::to_string(loss_value) + " at step " +
                                  std::to_string(step + 1) + " (learning rate too high, or bad input values?)");
    }
    torch::Tensor objective = out.loss * (scaler.scale() / static_cast<double>(micro_batches.size()));
    // The proximal term once per optimizer step (weights do not change between its micro-batches), in fp32.
    if (!anchors.empty() && &indices == &micro_batches.front()) {
      objective = objective + ProximalTerm(params, anchors, options.proximal_mu) * scaler.scale();
    }
    objective.backward();
    totals.loss += loss_value / static_cast<double>(micro_batches.size());
    totals.tokens += out.num_tokens;
    totals.examples += static_cast<int64_t>(indices.size());
  }
  return totals;
}

// One optimizer step's micro-batches of the epoch's `order`, from `position` on: up to gradient_accumulation_steps
// of them, never past the epoch's end. Advances `position` past them.
std::vector<std::span<const int64_t>> TakeMicroBatches(const std::vector<int64_t>& order, int64_t& position,
                                                       const protocol::TrainingConfig& config) {
  const int64_t n = static_cast<int64_t>(order.size());
  std::vector<std::span<const int64_t>> micro_batches;
  for (int64_t m = 0; m < config.gradient_accumulation_steps && position < n; ++m) {
    const int64_t count = std::min<int64_t>(config.batch_size, n - position);
    micro_batches.emplace_back(order.data() + position, static_cast<size_t>(count));
    position += count;
  }
  return micro_batches;
}

// The progress report of optimizer step `step` (0-based) that took `seconds`; `applied`: false when it was skipped.
StepProgress ProgressOf(int64_t step, int64_t total_steps, int64_t epoch, double lr, double grad_norm,
                        const StepTotals& totals, double seconds, bool language_model, bool applied) {
  StepProgress progress;
  progress.step = step + 1;
  progress.total_steps = total_steps;
  progress.epoch = epoch;
  progress.loss = totals.loss;
  progress.learning_rate = lr;
  progress.grad_norm = grad_norm;
  progress.tokens_per_s = language_model && seconds > 0 ? totals.tokens / seconds : 0;
  progress.samples_per_s = seconds > 0 ? totals.examples / seconds : 0;
  progress.skipped = !applied;
  return progress;
}

}  // namespace

StatusOr<TrainSummary> Train(TrainableModel& model, const ExampleSet& examples, const TrainOptions& options) {
  const protocol::TrainingConfig& config = options.config;
  const torch::Device device = model.device();
  PARSYN_RETURN_IF_ERROR(CheckPrecision(config.mixed_precision, device));
  const double mu = options.proximal_mu;
  if (!std::isfinite(mu) || mu < 0 || mu > protocol::kMaxProximalMu) {
    return InvalidArgumentError("proximal_mu (" + protocol::FieldReader::FormatNumber(mu) + ") must be >= 0 and <= " +
                                protocol::FieldReader::FormatNumber(protocol::kMaxProximalMu) +
                                " (FedProx's mu; 0: plain training)");
  }
  PARSYN_ASSIGN_OR_RETURN(const StepPlan plan, PlanSteps(config, examples.size(), options.max_steps));
  const int64_t schedule_total = options.schedule_total_steps.value_or(options.schedule_start_step + plan.total_steps);

  TrainSummary summary;
  const auto start = Clock::now();
  try {
    torch::manual_seed(options.seed);
    if (device.is_cuda()) torch::cuda::manual_seed_all(options.seed);

    std::vector<torch::Tensor> params = model.TrainableParameters();
    const std::vector<std::string> names = model.TrainableNames();
    if (params.size() != names.size()) {
      return InternalError("model returned " + std::to_string(params.size()) + " trainable parameters but " +
                           std::to_string(names.size()) + " names");
    }
    if (params.empty()) return InvalidArgumentError("the model has no trainable parameters");
    torch::optim::AdamW optimizer(ParamGroups(model, params, names, config),
                                  torch::optim::AdamWOptions(config.learning_rate));
    // FedProx's anchor: the weights this run starts from, frozen (fp32, on the model's device).
    const std::vector<torch::Tensor> anchors = mu > 0 ? FrozenCopies(params) : std::vector<torch::Tensor>();
    LossScaler scaler(config.mixed_precision == MixedPrecision::kFp16);

    model.Train(true);
    const int64_t n = examples.size();
    int64_t epoch = 0;
    std::vector<int64_t> order = data::ShuffledIndices(n, EpochSeed(options.seed, epoch));
    int64_t position = 0;
    double loss_sum = 0;

    for (int64_t step = 0; step < plan.total_steps; ++step) {
      if (position >= n) {
        ++epoch;
        order = data::ShuffledIndices(n, EpochSeed(options.seed, epoch));
        position = 0;
      }
      const auto step_start = Clock::now();
      const double lr = LearningRateAt(config, options.schedule_start_step + step, schedule_total);
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      }
      optimizer.zero_grad();

      const std::vector<std::span<const int64_t>> micro_batches = TakeMicroBatches(order, position, config);
      PARSYN_ASSIGN_OR_RETURN(const StepTotals totals, AccumulateGradients(model, examples, micro_batches, options,
                                                                           scaler, params, anchors, step));

      scaler.Unscale(params);
      const double max_norm = config.max_grad_norm > 0 ? config.max_grad_norm : std::numeric_limits<double>::infinity();
      const double grad_norm = torch::nn::utils::clip_grad_norm_(params, max_norm);
      const bool apply = scaler.Update(std::isfinite(grad_norm));
      if (apply) optimizer.step();

      const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
      summary.steps = step + 1;
      summary.examples_seen += totals.examples;
      summary.tokens_seen += totals.tokens;
      loss_sum += totals.loss;
      if (options.on_step) {
        options.on_step(
            ProgressOf(step, plan.total_steps, epoch, lr, grad_norm, totals, seconds, options.language_model, apply));
      }
    }
    summary.mean_loss = summary.steps > 0 ? loss_sum / static_cast<double>(summary.steps) : 0;
  } catch (const std::exception& e) {
    return StatusFromTorchException(e, "training");
  }
  summary.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

StatusOr<EvalMetrics> Evaluate(TrainableModel& model, const ExampleSet& examples, int64_t batch_size,
                               MixedPrecision autocast_precision, std::stop_token stop) {
  const torch::Device device = model.device();
  PARSYN_RETURN_IF_ERROR(CheckPrecision(autocast_precision, device));
  if (batch_size < 1) return InvalidArgumentError("evaluation batch size must be >= 1");
  EvalMetrics metrics;
  metrics.num_examples = examples.size();
  double loss_sum = 0;  // sum over counted positions
  int64_t correct = 0;
  int64_t rows = 0;
  int64_t exact_rows = 0;
  try {
    torch::NoGradGuard no_grad;
    model.Train(false);
    std::vector<int64_t> indices;
    for (int64_t begin = 0; begin < examples.size(); begin += batch_size) {
      if (stop.stop_requested()) {
        model.Train(true);
        return CancelledError("evaluation stopped on request");
      }
      indices.clear();
      for (int64_t i = begin; i < std::min(begin + batch_size, examples.size()); ++i) indices.push_back(i);
      const Batch batch = examples.MakeBatch(indices, device);
      StepOutput out;
      {
        AutocastScope autocast(autocast_precision, device);
        out = model.Forward(batch);
      }
      if (out.num_counted > 0) loss_sum += out.loss.item<double>() * static_cast<double>(out.num_counted);
      metrics.num_counted += out.num_counted;
      correct += out.num_correct;
      rows += out.num_rows;
      exact_rows += out.num_exact_rows;
    }
    model.Train(true);
  } catch (const std::exception& e) {
    return StatusFromTorchException(e, "evaluation");
  }
  if (metrics.num_counted > 0) {
    metrics.loss = loss_sum / static_cast<double>(metrics.num_counted);
    metrics.perplexity = std::exp(metrics.loss);
    metrics.accuracy = static_cast<double>(correct) / static_cast<double>(metrics.num_counted);
  }
  if (rows > 0) metrics.exact_match = static_cast<double>(exact_rows) / static_cast<double>(rows);
  return metrics;
}

}  // namespace parsyn::trainer
