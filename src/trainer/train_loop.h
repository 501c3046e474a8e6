// The training loop and evaluation, over any TrainableModel (trainable_model.h) and any ExampleSet.
//
// Steps, epochs and the learning-rate schedule (the contract written in src/trainer/README.md too):
//   - A micro-batch holds `batch_size` examples; an optimizer step accumulates `gradient_accumulation_steps`
//     micro-batches (gradients averaged over them), then clips to `max_grad_norm` and applies AdamW.
//   - Steps per epoch = ceil(ceil(num_examples / batch_size) / gradient_accumulation_steps). The last micro-batch of
//     an epoch may be smaller; a step never spans two epochs.
//   - A step budget (`max_steps` > 0) wins: exactly that many optimizer steps run, the data reshuffled at the start of
//     every epoch, as many epochs (or part of one) as that takes; `epochs` is ignored. Without one, the loop runs
//     epochs x steps-per-epoch steps.
//   - Epoch e's order is data::ShuffledIndices(n, Mix(seed, e)): the same seed gives the same order on every run.
//   - The schedule's length is `schedule_total_steps` when set (a federated job passes the job's total so rounds
//     continue one schedule, starting at `schedule_start_step`), else this run's step count. Step s (0-based) uses
//     lr(s) = lr * min(1, (s+1)/warmup) during warmup, then constant / linear decay to 0 / cosine decay to 0 over the
//     remaining steps.
//
// Mixed precision: bf16 runs the forward under autocast (CPU and CUDA; weights and optimizer state stay fp32).
// fp16 is CUDA only (autocast fp16 + dynamic loss scaling: a step whose gradients are not finite is skipped and the
// scale halved); on CPU it is InvalidArgument.
//
// FedProx (Li et al., MLSys 2020): with proximal_mu > 0 each optimizer step's loss gets the proximal term
// mu/2 * sum_i ||w_i - w0_i||^2 over the trainable parameters (LoRA: the adapters only), w0 being a frozen fp32 copy of
// them taken on the model's device as Train starts (a worker's round global). Its gradient, mu * (w - w0), joins the
// data gradient before clipping, once per optimizer step (not once per micro-batch). The term is computed in fp32
// outside autocast, in every precision mode. Reported losses are the data loss alone. proximal_mu 0 adds nothing:
// the run is the plain one, bit for bit.
//
// Determinism: on CPU with the same seed, thread count and inputs, two runs produce bit-identical weights (the loop
// seeds torch and its own shuffles; LoRA dropout draws from torch's seeded generator).
//
// Everything here runs on the calling thread; `stop` may be requested from any thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stop_token>

#include "base/status.h"
#include "protocol/training_config.h"
#include "trainer/trainable_model.h"

namespace parsyn::trainer {

using protocol::LrScheduler;
using protocol::MixedPrecision;

// A fixed set of examples the loop draws batches from (tokenized text, standardised tabular rows).
// Used from one thread.
class ExampleSet {
 public:
  virtual ~ExampleSet() = default;
  virtual int64_t size() const = 0;
  // The batch of the examples at `indices` (each < size()), on `device`.
  virtual Batch MakeBatch(std::span<const int64_t> indices, torch::Device device) const = 0;
};

struct StepPlan {
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
};
// InvalidArgument when num_examples < 1 or max_steps < 0.
StatusOr<StepPlan> PlanSteps(const protocol::TrainingConfig& config, int64_t num_examples,
                             std::optional<int64_t> max_steps);

// Learning rate of 0-based optimizer step `step` in a schedule of `total_steps` steps.
double LearningRateAt(const protocol::TrainingConfig& config, int64_t step, int64_t total_steps);

// "cpu", "cuda", "cuda:N". InvalidArgument for other spellings; FailedPrecondition for CUDA when libtorch has none
// ("this libtorch was built without CUDA") or N is out of range.
StatusOr<torch::Device> ParseDevice(std::string_view name);

struct StepProgress {
  int64_t step = 0;  // 1-based optimizer step just finished
  int64_t total_steps = 0;
  int64_t epoch = 0;         // 0-based
  double loss = 0;           // mean over this step's micro-batches
  double learning_rate = 0;  // the rate this step used
  double grad_norm = 0;      // before clipping
  double tokens_per_s = 0;   // language models: input tokens/s over this step (0 for tabular)
  double samples_per_s = 0;  // examples/s over this step
  bool skipped = false;      // fp16: gradients overflowed, the step was not applied
};

struct TrainOptions {
  protocol::TrainingConfig config;   // the job's training keys (training_config.h)
  std::optional<int64_t> max_steps;  // the step budget; see above
  uint64_t seed = 0;
  int64_t schedule_start_step = 0;
  std::optional<int64_t> schedule_total_steps;
  double proximal_mu = 0;       // FedProx's mu, 0..protocol::kMaxProximalMu (see above); 0: plain training
  bool language_model = false;  // reports tokens/s
  // Run forwards under autocast for config.mixed_precision. False for models that run reduced precision themselves
  // (CausalLm's compute dtype); fp16 loss scaling applies either way.
  bool autocast = true;
  std::function<void(const StepProgress&)> on_step;  // called after every optimizer step
  std::stop_token stop;                              // checked between micro-batches
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t examples_seen = 0;  // with repetition across epochs
  int64_t tokens_seen = 0;
  double mean_loss = 0;  // mean of the steps' losses
  double wall_seconds = 0;
};

// FedProx's proximal term mu/2 * sum_i ||params_i - anchors_i||^2 as an fp32 scalar on the anchors' device,
// differentiable in `params` (its gradient is mu * (params_i - anchors_i)). `anchors` are fp32, one per parameter,
// same shapes; neither list is empty.
torch::Tensor ProximalTerm(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& anchors,
                           double mu);

// Trains `model` in place. Errors: InvalidArgument (bad config or proximal_mu, fp16 on CPU), Cancelled when `stop` was
// requested (the model then holds the weights of the last finished step), ResourceExhausted when memory runs out,
// Internal for other libtorch failures.
StatusOr<TrainSummary> Train(TrainableModel& model, const ExampleSet& examples, const TrainOptions& options);

struct EvalMetrics {
  int64_t num_examples = 0;
  int64_t num_counted = 0;  // label positions (LM) or rows (tabular)
  double loss = 0;          // mean over counted positions
  double perplexity = 0;    // exp(loss)
  double accuracy = 0;      // token accuracy (LM) or classification accuracy (tabular)
  double exact_match = 0;   // share of examples whose every label is the greedy (argmax) prediction
};

// Forward passes under NoGradGuard in eval mode, `batch_size` examples at a time, in index order, under autocast for
// `autocast_precision` (kNo for none); the model is put back into training mode afterwards. An empty set gives
// num_examples 0 and zero metrics.
StatusOr<EvalMetrics> Evaluate(TrainableModel& model, const ExampleSet& examples, int64_t batch_size,
                               MixedPrecision autocast_precision, std::stop_token stop = {});

// libtorch reports failures as exceptions; the trainer turns them into a Status here: ResourceExhausted ("out of
// memory while <doing>: ...") for allocation failures on any device, else Internal. Keeps the first line of the
// message (libtorch appends a C++ stack trace).
Status StatusFromTorchException(const std::exception& e, std::string_view doing);

}  // namespace parsyn::trainer
