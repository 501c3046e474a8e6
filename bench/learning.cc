// bench_learning: what the strategies learn, side by side in one run, with the targets as PASS/MISS lines.
// Everything is the project's: participants from each strategy's ConfigureRound (client sampling), aggregation through
// strategy::MakeStrategy, non-IID shards from coordinator::SplitRowsByLabel, and local training by the trainer's own
// loop (trainer::Train on a TabularModel, FedProx's proximal term as TrainOptions::proximal_mu) — in this process, with
// one torch thread, so hundreds of rounds fit in minutes. docs/learning-benchmarks.md says what was chosen and why.
//
//   1. Aggregation memory: peak RSS of FedAvg / FedProx / FedAdam aggregating K = 2, 8, 32 updates of a 16 MiB model,
//      each in a child process (this program re-executed), updates made and dropped one at a time as they arrive.
//   2. FedProx's Synthetic(alpha, beta) (Li et al., MLSys 2020), FedAvg vs FedProx (mu = 1), 0% and 90% stragglers.
//   3. scikit-learn's digits (bench/digits_csv.py, Debian python3-sklearn), Dirichlet(0.3) over 10 workers: FedAvg,
//      FedProx, FedAdam, FedYogi and centralised training at the same number of optimizer steps.
//   4. Robustness on digits: 2 of 10 workers send scaled or sign-flipped updates; FedAvg vs median, trimmed mean, Krum.
//   5. DP-FedAvg on digits: accuracy against epsilon (RDP accountant) for three noise multipliers.
//   6. Workers of different LoRA ranks (learning_lora_ranks.cc): exact factored aggregation against zero-padding and
//      against every worker at rank 4, on colour questions over 6 workers, 3 seeds.
//
//   7. Asynchronous buffered aggregation (learning_async.cc): FedBuff vs synchronous FedAvg over 100 workers of
//      lognormal speeds, in virtual time to 90% test accuracy, and with equal speeds as the honesty check.
//
//   bench_learning [--quick] [--only memory|synthetic|noniid|robust|dp|ranks|async]
//   (--quick: few rounds, to check the harness; the targets then mean little)
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/testing/build_paths.h"
#include "bench_support.h"
#include "coordinator/partition.h"
#include "data/dataset.h"
#include "learning_async.h"
#include "learning_digits.h"
#include "learning_lora_ranks.h"
#include "protocol/trainer_task.h"
#include "strategy/make_strategy.h"
#include "strategy/round_aggregation.h"
#include "strategy/strategy.h"
#include "trainer/tabular_model.h"
#include "trainer/train_loop.h"
#include "weights/weight_set.h"

namespace {

namespace bench = parsyn::bench;
namespace coordinator = parsyn::coordinator;
namespace data = parsyn::data;
namespace protocol = parsyn::protocol;
namespace strategy = parsyn::strategy;
namespace trainer = parsyn::trainer;
namespace weights = parsyn::weights;
using bench::Check;
using bench::Die;
using bench::Digits;
using bench::DigitsConfig;
using bench::DigitsFederation;
using bench::Evaluate;
using bench::Federation;
using bench::LoadDigits;
using bench::Must;
using bench::TrainLocal;
using strategy::StrategyKind;

constexpr uint64_t kSeed = bench::kLearningSeed;

// The private key dp_fedavg draws its noise and sample under (a job's is random; the bench's is fixed, so that its
// figures repeat).
weights::SecretKey BenchKey() {
  weights::SecretKey key;
  key.fill(0x2a);
  return key;
}

// CPU seconds of this process and of its children waited for (the aggregation children).
double CpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  rusage children{};
  ::getrusage(RUSAGE_CHILDREN, &children);
  auto seconds = [](const timeval& v) { return static_cast<double>(v.tv_sec) + 1e-6 * static_cast<double>(v.tv_usec); };
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec) + seconds(children.ru_utime) +
         seconds(children.ru_stime);
}

const char* Verdict(bool pass) { return pass ? "PASS" : "MISS"; }

// ---------------------------------------------------------------------------------------------------------------
// 1. Aggregation memory.

constexpr int64_t kMemoryModelFloats = int64_t{4} << 20;  // 16 MiB of fp32, in four tensors

// The child: aggregates K generated updates with `kind` and exits; its peak RSS is what the parent reads.
int AggregationChild(StrategyKind kind, int k) {
  auto fill = [](weights::WeightSet& set, float base) {
    for (const weights::Tensor& t : set.tensors()) {
      std::span<float> v = t.as<float>();
      for (size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i % 1024) * 1e-4f;
    }
  };
  auto make = [](weights::WeightSet& set) {
    for (int i = 0; i < 4; ++i) {
      Must(set.AddZeros("layers." + std::to_string(i) + ".weight", weights::DType::kF32,
                        {kMemoryModelFloats / 4 / 1024, 1024}),
           "allocating a tensor");
    }
  };
  weights::WeightSet global;
  make(global);
  fill(global, 0.5f);
  auto s = Must(strategy::MakeStrategy(kind, strategy::DefaultStrategyOptions(kind), BenchKey()), "MakeStrategy");
  strategy::RoundAggregation aggregation(*s);
  Check(aggregation.Begin(1, global), "Begin");
  for (int i = 0; i < k; ++i) {
    weights::WeightSet update;  // as the coordinator: one update in memory at a time, dropped once accepted
    make(update);
    fill(update, 0.5f + 0.01f * static_cast<float>(i));
    Check(aggregation.Accept(update, 100 + i), "Accept");
  }
  weights::WeightSet next = Must(aggregation.Finish(), "Finish");
  s->CommitState();
  return next.size() == global.size() ? 0 : 1;
}

// Peak RSS (MiB) of one child run.
double ChildPeakRssMiB(StrategyKind kind, int k) {
  const std::string kind_arg = std::to_string(static_cast<int>(kind));
  const std::string k_arg = std::to_string(k);
  const pid_t pid = ::fork();
  if (pid < 0) Die("fork failed");
  if (pid == 0) {
    ::execl("/proc/self/exe", "bench_learning", "--aggregation-child", kind_arg.c_str(), k_arg.c_str(), nullptr);
    std::_Exit(127);
  }
  int status = 0;
  rusage usage{};
  if (::wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die("the aggregation child for K = " + k_arg + " failed");
  }
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

void AggregationMemory() {
  std::printf("\n== 1. Aggregation memory: peak RSS of one process aggregating K updates of a %.0f MiB fp32 model ==\n",
              static_cast<double>(kMemoryModelFloats) * 4 / (1 << 20));
  std::printf("(each update generated, accepted and dropped in turn, as the coordinator streams them)\n");
  std::printf("%-22s %10s %10s %10s %16s\n", "strategy", "K=2 MiB", "K=8 MiB", "K=32 MiB", "32 vs 2 (models)");
  const double model_mib = static_cast<double>(kMemoryModelFloats) * 4 / (1 << 20);
  bool flat = true;
  for (StrategyKind kind :
       {StrategyKind::kFederatedAveraging, StrategyKind::kFedProx, StrategyKind::kFedAdam, StrategyKind::kFedYogi}) {
    const double k2 = ChildPeakRssMiB(kind, 2), k8 = ChildPeakRssMiB(kind, 8), k32 = ChildPeakRssMiB(kind, 32);
    const double growth = (k32 - k2) / model_mib;
    // Holding the updates would add 30 models from K = 2 to K = 32; streaming adds none (allow allocator slack).
    flat = flat && growth < 1.0;
    std::printf("%-22s %10.1f %10.1f %10.1f %+16.2f\n", std::string(strategy::StrategyKindName(kind)).c_str(), k2, k8,
                k32, growth);
  }
  std::printf("%s  aggregation memory is O(model): peak RSS grows by < 1 model from K = 2 to K = 32\n", Verdict(flat));
}

// ---------------------------------------------------------------------------------------------------------------
// w <- global + factor * (w - global): an attacker's scaled (factor > 1) or sign-flipped (factor < 0) update.
void ScaleUpdate(weights::WeightSet& update, const weights::WeightSet& global, float factor) {
  for (size_t t = 0; t < update.size(); ++t) {
    std::span<float> w = update[t].as<float>();
    std::span<const float> g = global[t].as<float>();
    for (size_t i = 0; i < w.size(); ++i) w[i] = g[i] + factor * (w[i] - g[i]);
  }
}

struct RunSpec {
  StrategyKind kind = StrategyKind::kFederatedAveraging;
  strategy::StrategyOptions options;
  int rounds = 1;
  protocol::TrainingConfig config;     // the job's training keys
  std::optional<int64_t> local_steps;  // unset: config.epochs epochs per round
  // The round's work of a participant (0-based position in the round, worker): its step budget, or nullopt to drop
  // it (a straggler FedAvg does not wait for). Unset: everyone runs local_steps.
  std::function<std::optional<std::optional<int64_t>>(int round, int position, int worker)> work;
  // Applied to worker `worker`'s update before it is sent (an attacker); unset: honest.
  std::function<void(int worker, weights::WeightSet& update, const weights::WeightSet& global)> tamper;
  int64_t eligible_workers = 0;  // dp_fedavg's q = K / eligible
  std::function<void(int round, const weights::WeightSet& global, strategy::Strategy& s)> after_round;
};

struct RunResult {
  weights::WeightSet global;
  int64_t optimizer_steps = 0;  // over all workers and rounds
};

// A federated job, in process: each round ConfigureRound picks the participants, each trains from the global, the
// strategy aggregates, and the round commits.
RunResult RunFederated(Federation& fed, trainer::TabularModel& model, const weights::WeightSet& initial,
                       const RunSpec& run) {
  auto s = Must(strategy::MakeStrategy(run.kind, run.options, BenchKey()), "MakeStrategy");
  if (run.eligible_workers > 0) s->set_eligible_workers(run.eligible_workers);  // dp_fedavg's q = K / n
  strategy::RoundAggregation aggregation(*s);
  const int n = static_cast<int>(fed.workers.size());
  std::vector<strategy::Candidate> candidates;
  for (int w = 0; w < n; ++w) candidates.push_back({.worker_id = w + 1, .shard = w});
  RunResult result{initial.Clone(), 0};
  for (int round = 1; round <= run.rounds; ++round) {
    strategy::RoundContext ctx{
        .job_seed = kSeed, .round = round, .min_workers = 1, .max_workers = n, .sampling = run.options.sampling};
    const std::vector<strategy::ParticipantConfig> participants = s->ConfigureRound(ctx, candidates);
    Check(aggregation.Begin(round, result.global), "Begin");
    for (size_t position = 0; position < participants.size(); ++position) {
      const strategy::ParticipantConfig& p = participants[position];
      std::optional<int64_t> steps = run.local_steps;
      if (run.work) {
        auto w = run.work(round, static_cast<int>(position), p.shard);
        if (!w) continue;  // dropped
        steps = *w;
      }
      auto [update, ran] =
          TrainLocal(model, result.global, fed.workers[p.shard], run.config, steps, run.options.mu, p.seed);
      result.optimizer_steps += ran;
      if (run.tamper) run.tamper(p.shard, update, result.global);
      Check(aggregation.Accept(update, fed.worker_sizes[p.shard]), "Accept");
    }
    if (aggregation.num_accepted() > 0) {
      result.global = Must(aggregation.Finish(), "Finish");
      s->CommitState();
    }
    if (run.after_round) run.after_round(round, result.global, *s);
  }
  return result;
}

strategy::StrategyOptions Options(StrategyKind kind) { return strategy::DefaultStrategyOptions(kind); }

// ---------------------------------------------------------------------------------------------------------------
// 2. Synthetic(alpha, beta).

struct SyntheticTask {
  Federation fed;
  int64_t num_train = 0, num_test = 0, min_size = 0, max_size = 0;
};

// Li et al. 2020 (after Shamir et al. 2014), as their generator does: device k draws u_k ~ N(0, alpha) and
// B_k ~ N(0, beta); W_k ~ N(u_k, 1) (60 x 10) and b_k ~ N(u_k, 1); v_k ~ N(B_k, 1) per feature; x ~ N(v_k, Sigma) with
// Sigma = diag(j^-1.2); y = argmax softmax(x W_k + b_k). Sizes: int(lognormal(4, 2)) + 50 (power law). Of each
// device, the first 80% of its samples train, the rest test (the paper's 80/20).
SyntheticTask MakeSynthetic(double alpha, double beta, uint64_t seed) {
  constexpr int kDevices = 30, kDim = 60, kClasses = 10;
  coordinator::PartitionRandom rng(seed);
  SyntheticTask task;
  data::TabularDataset& ds = task.fed.dataset;
  for (int j = 0; j < kDim; ++j) ds.feature_names.push_back("x" + std::to_string(j));
  for (int c = 0; c < kClasses; ++c) ds.class_names.push_back(std::to_string(c));
  std::vector<std::vector<int64_t>> train_rows(kDevices);
  std::vector<int64_t> all_train, all_test;
  task.min_size = INT64_MAX;
  for (int k = 0; k < kDevices; ++k) {
    const int64_t size = static_cast<int64_t>(std::exp(4.0 + 2.0 * rng.Normal())) + 50;
    task.min_size = std::min(task.min_size, size);
    task.max_size = std::max(task.max_size, size);
    const double u = alpha * rng.Normal();
    const double b_mean = beta * rng.Normal();
    std::vector<double> w(kDim * kClasses), b(kClasses), v(kDim);
    for (double& x : w) x = u + rng.Normal();
    for (double& x : b) x = u + rng.Normal();
    for (double& x : v) x = b_mean + rng.Normal();
    const int64_t train_size = size * 8 / 10;
    for (int64_t i = 0; i < size; ++i) {
      std::vector<double> x(kDim);
      for (int j = 0; j < kDim; ++j) x[j] = v[j] + std::pow(j + 1.0, -0.6) * rng.Normal();
      int best = 0;
      double best_logit = -1e300;
      for (int c = 0; c < kClasses; ++c) {
        double logit = b[c];
        for (int j = 0; j < kDim; ++j) logit += x[j] * w[j * kClasses + c];
        if (logit > best_logit) best_logit = logit, best = c;
      }
      const int64_t row = ds.num_rows();
      for (double f : x) ds.features.push_back(static_cast<float>(f));
      ds.labels.push_back(best);
      (i < train_size ? train_rows[k] : all_test).push_back(row);
      if (i < train_size) all_train.push_back(row);
    }
  }
  task.num_train = static_cast<int64_t>(all_train.size());
  task.num_test = static_cast<int64_t>(all_test.size());
  // The features as generated (no standardisation): the model sees the paper's problem.
  trainer::TabularModelSpec& spec = task.fed.spec;
  spec.model_type = protocol::TabularModelType::kLogreg;
  spec.feature_names = ds.feature_names;
  spec.class_names = ds.class_names;
  spec.standardizer.mean.assign(kDim, 0.0f);
  spec.standardizer.std.assign(kDim, 1.0f);
  AddWorkers(task.fed, train_rows);
  task.fed.train_all = Must(trainer::TabularExamples::Create(ds, all_train, spec), "training rows");
  task.fed.test = Must(trainer::TabularExamples::Create(ds, all_test, spec), "test rows");
  return task;
}

struct SyntheticOutcome {
  double loss = 0, accuracy = 0, loss_std = 0, worst_loss = 0;
};

// 90% of a round's devices straggle: FedAvg drops them, FedProx takes their uniform 1..local_steps-1 steps. The same
// stragglers and budgets for both methods: drawn from (round, position) alone.
decltype(RunSpec::work) StragglerWork(int per_round, int64_t local_steps, bool prox) {
  return [=](int round, int position, int) -> std::optional<std::optional<int64_t>> {
    coordinator::PartitionRandom r(strategy::TaskSeed(kSeed, round, 1000));
    std::vector<int64_t> order(per_round);
    for (int i = 0; i < per_round; ++i) order[i] = i;
    r.Shuffle(order);
    const int stragglers = per_round * 9 / 10;
    const auto at = std::find(order.begin(), order.end(), position) - order.begin();
    if (at >= stragglers) return std::optional<int64_t>(local_steps);
    if (!prox) return std::nullopt;
    coordinator::PartitionRandom budget(strategy::TaskSeed(kSeed, round, 2000 + position));
    return std::optional<int64_t>(1 + static_cast<int64_t>(budget.Below(local_steps - 1)));
  };
}

// One method on one Synthetic task: the final training loss and test accuracy, and the standard deviation and worst
// of the training loss over the last `tail` rounds.
SyntheticOutcome RunSynthetic(Federation& fed, trainer::TabularModel& model, const weights::WeightSet& initial,
                              RunSpec run, int tail) {
  std::vector<double> losses;
  run.after_round = [&](int round, const weights::WeightSet& global, strategy::Strategy&) {
    if (round > run.rounds - tail) losses.push_back(Evaluate(model, global, *fed.train_all).loss);
  };
  RunResult r = RunFederated(fed, model, initial, run);
  SyntheticOutcome o;
  o.loss = Evaluate(model, r.global, *fed.train_all).loss;
  o.accuracy = Evaluate(model, r.global, *fed.test).accuracy;
  double mean = 0;
  for (double l : losses) mean += l / static_cast<double>(losses.size());
  for (double l : losses) o.loss_std += (l - mean) * (l - mean) / static_cast<double>(losses.size());
  o.loss_std = std::sqrt(o.loss_std);
  o.worst_loss = *std::max_element(losses.begin(), losses.end());
  return o;
}

void SyntheticBenchmark(bool quick) {
  const int rounds = quick ? 10 : 200;
  const int per_round = 10;
  const int64_t local_steps = 20;
  const int tail = std::min(rounds, 20);
  protocol::TrainerConfig config;
  config.model_type = protocol::TabularModelType::kLogreg;
  config.training.hidden_sizes = {};
  config.training.batch_size = 10;
  config.training.learning_rate = 0.01;
  config.training.lr_scheduler = protocol::LrScheduler::kConstant;
  config.training.warmup_steps = 0;
  config.training.weight_decay = 0;
  config.training.max_grad_norm = 0;
  config.training.validation_fraction = 0;

  std::printf("\n== 2. FedProx's Synthetic(alpha, beta): 30 devices, multinomial logistic regression (60 -> 10) ==\n");
  std::printf(
      "%d rounds, %d devices per round (seeded client sampling), %lld local steps of batch %lld, AdamW lr %g "
      "(the trainer's loop); stragglers: 90%% of a round's devices run a uniform 1..%lld steps; FedAvg drops "
      "them, FedProx (mu = 1) takes their partial work\n",
      rounds, per_round, static_cast<long long>(local_steps), static_cast<long long>(config.training.batch_size),
      config.training.learning_rate, static_cast<long long>(local_steps - 1));
  std::printf(
      "loss: training loss over all devices' training rows after the last round; sd / worst: standard "
      "deviation / maximum of it over the last %d rounds (stability)\n",
      tail);
  std::printf("%-16s %-10s %-12s %9s %9s %9s %9s\n", "setting", "stragglers", "method", "loss", "sd", "worst",
              "test acc");
  bool ordering = true;
  for (auto [alpha, beta] : {std::pair{0.0, 0.0}, std::pair{0.5, 0.5}, std::pair{1.0, 1.0}}) {
    SyntheticTask task = MakeSynthetic(alpha, beta, kSeed + static_cast<uint64_t>(alpha * 10));
    Federation& fed = task.fed;
    auto model = Must(trainer::TabularModel::Create(fed.spec, kSeed, torch::kCPU), "model");
    const weights::WeightSet initial = Must(model->ExportTrainable(), "export");
    char setting[64];
    std::snprintf(setting, sizeof setting, "(%g, %g)", alpha, beta);
    SyntheticOutcome outcomes[2][2];  // [stragglers 0/90][fedavg/fedprox]
    for (int straggling = 0; straggling < 2; ++straggling) {
      for (int prox = 0; prox < 2; ++prox) {
        RunSpec run;
        run.kind = prox ? StrategyKind::kFedProx : StrategyKind::kFederatedAveraging;
        run.options = Options(run.kind);
        if (prox) run.options.mu = 1.0;
        run.options.sampling.count = per_round;
        run.rounds = rounds;
        run.config = config.training;
        run.local_steps = local_steps;
        if (straggling) run.work = StragglerWork(per_round, local_steps, prox);
        SyntheticOutcome& o = outcomes[straggling][prox];
        o = RunSynthetic(fed, *model, initial, run, tail);
        std::printf("%-16s %-10s %-12s %9.4f %9.4f %9.4f %8.2f%%\n", setting, straggling ? "90%" : "0%",
                    prox ? "FedProx mu=1" : "FedAvg", o.loss, o.loss_std, o.worst_loss, 100 * o.accuracy);
        std::fflush(stdout);
      }
    }
    std::printf("%-16s devices %lld..%lld samples, %lld train / %lld test\n", "", static_cast<long long>(task.min_size),
                static_cast<long long>(task.max_size), static_cast<long long>(task.num_train),
                static_cast<long long>(task.num_test));
    const SyntheticOutcome& avg = outcomes[1][0];
    const SyntheticOutcome& prox = outcomes[1][1];
    ordering = ordering && prox.loss < avg.loss && prox.loss_std <= avg.loss_std;
  }
  std::printf(
      "%s  FedProx's ordering: with 90%% stragglers FedProx (mu = 1) ends at a lower training loss and varies "
      "less than FedAvg that drops stragglers, in all three settings\n",
      Verdict(ordering));
}

// ---------------------------------------------------------------------------------------------------------------
// Digits (3, 4, 5).

void DigitsNonIid(const Digits& d, bool quick) {
  const int rounds = quick ? 3 : 40;
  protocol::TrainerConfig config = DigitsConfig();
  config.training.epochs = 1;
  const coordinator::DataPartition partition{
      .method = coordinator::PartitionMethod::kDirichlet, .alpha = 0.3, .classes_per_worker = 2, .label = ""};
  Federation fed = DigitsFederation(d, 10, partition, config);
  auto model = Must(trainer::TabularModel::Create(fed.spec, kSeed, torch::kCPU), "model");
  const weights::WeightSet initial = Must(model->ExportTrainable(), "export");

  std::printf("\n== 3. digits (scikit-learn, %lld rows: %lld train / %lld test), Dirichlet(0.3) over 10 workers ==\n",
              static_cast<long long>(d.dataset.num_rows()), static_cast<long long>(d.train_pool.size()),
              static_cast<long long>(d.test_rows.size()));
  std::printf(
      "MLP 64 -> 32 -> 10; %d rounds, every worker every round, %lld local epoch of batch %lld, AdamW lr %g; "
      "centralised: the same model and loop over the whole train pool for the federated runs' total steps\n",
      rounds, static_cast<long long>(config.training.epochs), static_cast<long long>(config.training.batch_size),
      config.training.learning_rate);
  std::printf("worker sizes:");
  for (int64_t n : fed.worker_sizes) std::printf(" %lld", static_cast<long long>(n));
  std::printf("\n%-34s %14s %10s\n", "method", "optimizer steps", "test acc");

  struct Method {
    const char* label;
    StrategyKind kind;
    std::function<void(strategy::StrategyOptions&)> tune;
  };
  const std::vector<Method> methods = {
      {"FedAvg", StrategyKind::kFederatedAveraging, {}},
      {"FedProx (mu = 0.1)", StrategyKind::kFedProx, [](strategy::StrategyOptions& o) { o.mu = 0.1; }},
      // The documented defaults (docs/training.md): what a job gets without options.
      {"FedAdam (eta 0.1, tau 1e-9)", StrategyKind::kFedAdam, {}},
      {"FedYogi (eta 0.01, tau 1e-3)", StrategyKind::kFedYogi, {}},
  };
  double best = 0;
  int64_t steps = 0;
  for (const Method& m : methods) {
    RunSpec run;
    run.kind = m.kind;
    run.options = Options(m.kind);
    if (m.tune) m.tune(run.options);
    run.rounds = rounds;
    run.config = config.training;
    RunResult r = RunFederated(fed, *model, initial, run);
    const double accuracy = Evaluate(*model, r.global, *fed.test).accuracy;
    best = std::max(best, accuracy);
    steps = r.optimizer_steps;
    std::printf("%-34s %14lld %9.2f%%\n", m.label, static_cast<long long>(r.optimizer_steps), 100 * accuracy);
    std::fflush(stdout);
  }
  auto [central, ran] = TrainLocal(*model, initial, *fed.train_all, config.training, steps, 0, kSeed);
  const double central_accuracy = Evaluate(*model, central, *fed.test).accuracy;
  std::printf("%-34s %14lld %9.2f%%\n", "centralised", static_cast<long long>(ran), 100 * central_accuracy);
  std::printf("%s  the best strategy (%.2f%%) is within 2 points of centralised training (%.2f%%) at equal steps\n",
              Verdict(best >= central_accuracy - 0.02), 100 * best, 100 * central_accuracy);
}

void DigitsRobustness(const Digits& d, bool quick) {
  const int rounds = quick ? 3 : 30;
  protocol::TrainerConfig config = DigitsConfig();
  config.training.epochs = 1;
  Federation fed = DigitsFederation(d, 10, coordinator::DataPartition{}, config);  // iid
  auto model = Must(trainer::TabularModel::Create(fed.spec, kSeed, torch::kCPU), "model");
  const weights::WeightSet initial = Must(model->ExportTrainable(), "export");
  std::printf("\n== 4. Robustness: digits, IID over 10 workers, workers 0 and 1 attack every round ==\n");
  std::printf(
      "%d rounds, 1 local epoch; attacker update = global + factor * (its trained update - global); "
      "trimmed_mean beta 0.2, krum f 2\n",
      rounds);

  auto run_with = [&](StrategyKind kind, float factor) {
    RunSpec run;
    run.kind = kind;
    run.options = Options(kind);
    if (kind == StrategyKind::kTrimmedMean) run.options.beta = 0.2;
    if (kind == StrategyKind::kKrum) run.options.f = 2;
    run.rounds = rounds;
    run.config = config.training;
    if (factor != 1.0f) {
      run.tamper = [factor](int worker, weights::WeightSet& update, const weights::WeightSet& global) {
        if (worker < 2) ScaleUpdate(update, global, factor);
      };
    }
    RunResult r = RunFederated(fed, *model, initial, run);
    return Evaluate(*model, r.global, *fed.test).accuracy;
  };
  const double clean = run_with(StrategyKind::kFederatedAveraging, 1.0f);
  std::printf("attack-free FedAvg: %.2f%%\n", 100 * clean);
  std::printf("%-28s %10s %10s %10s %10s\n", "attack (2 of 10)", "FedAvg", "median", "trim 0.2", "krum f=2");
  bool robust = true;
  for (auto [label, factor] : {std::pair{"scaled x1000", 1000.0f}, std::pair{"sign-flipped x(-4)", -4.0f}}) {
    const double avg = run_with(StrategyKind::kFederatedAveraging, factor);
    const double med = run_with(StrategyKind::kMedian, factor);
    const double trim = run_with(StrategyKind::kTrimmedMean, factor);
    const double krum = run_with(StrategyKind::kKrum, factor);
    std::printf("%-28s %9.2f%% %9.2f%% %9.2f%% %9.2f%%\n", label, 100 * avg, 100 * med, 100 * trim, 100 * krum);
    std::fflush(stdout);
    const double floor = clean - 0.03;
    const bool pass = med >= floor && trim >= floor && krum >= floor && avg < floor;
    std::printf(
        "%s  %s: median, trimmed mean and Krum stay within 3 points of attack-free FedAvg while FedAvg falls "
        "below that\n",
        Verdict(pass), label);
    robust = robust && pass;
  }
  std::printf("%s  robustness, both attacks\n", Verdict(robust));
}

void DigitsDp(const Digits& d, bool quick) {
  const int workers = 100, per_round = 20;
  const int rounds = quick ? 5 : 60;
  const std::vector<int> report_at = quick ? std::vector<int>{5} : std::vector<int>{10, 30, 60};
  protocol::TrainerConfig config = DigitsConfig();
  config.model_type = protocol::TabularModelType::kLogreg;
  config.training.hidden_sizes = {};
  config.training.epochs = 3;
  config.training.learning_rate = 0.01;
  Federation fed = DigitsFederation(d, workers, coordinator::DataPartition{}, config);
  auto model = Must(trainer::TabularModel::Create(fed.spec, kSeed, torch::kCPU), "model");
  const weights::WeightSet initial = Must(model->ExportTrainable(), "export");
  const double clip = 0.5, delta = 1e-3;
  std::printf(
      "\n== 5. DP-FedAvg: digits, IID over %d workers, %d sampled per round (q = %.2f), logistic regression ==\n",
      workers, per_round, static_cast<double>(per_round) / workers);
  std::printf(
      "clip_norm %g, delta %g; epsilon from the strategy's RDP accountant after the round; %lld local epochs, "
      "AdamW lr %g\n",
      clip, delta, static_cast<long long>(config.training.epochs), config.training.learning_rate);
  std::printf("%-18s", "noise multiplier");
  for (int r : report_at) {
    char header[32];
    std::snprintf(header, sizeof header, "round %d: eps / acc", r);
    std::printf("%23s", header);
  }
  std::printf("\n");
  std::vector<double> final_accuracy;
  for (double sigma : {0.0, 0.5, 1.0, 2.0}) {
    RunSpec run;
    run.kind = StrategyKind::kDpFedAvg;
    run.options = Options(run.kind);
    run.options.clip_norm = clip;
    run.options.noise_multiplier = sigma;
    run.options.delta = delta;
    run.options.sampling.count = per_round;
    run.eligible_workers = workers;
    run.rounds = rounds;
    run.config = config.training;
    std::string line;
    run.after_round = [&](int round, const weights::WeightSet& global, strategy::Strategy& s) {
      if (std::find(report_at.begin(), report_at.end(), round) == report_at.end()) return;
      const std::optional<strategy::RoundPrivacy> privacy = s.CommittedRoundPrivacy();
      const double eps = privacy ? privacy->round.epsilon : 0.0;  // the ε spent after the last committed round
      const double acc = Evaluate(*model, global, *fed.test).accuracy;
      char cell[64];
      std::snprintf(cell, sizeof cell, "   %10.2f / %6.2f%%", eps, 100 * acc);
      line += cell;
      if (round == rounds) final_accuracy.push_back(acc);
    };
    RunFederated(fed, *model, initial, run);
    std::printf("%-18s%s\n", sigma == 0 ? "0 (clip only)" : std::to_string(sigma).substr(0, 3).c_str(), line.c_str());
    std::fflush(stdout);
  }
  bool monotone = true;
  for (size_t i = 2; i < final_accuracy.size(); ++i) monotone = monotone && final_accuracy[i] <= final_accuracy[i - 1];
  std::printf("(no target; for reading: accuracy %s as the noise multiplier grows and epsilon falls)\n",
              monotone ? "falls" : "does not fall monotonically");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--aggregation-child") == 0) {
    return AggregationChild(static_cast<StrategyKind>(std::atoi(argv[2])), std::atoi(argv[3]));
  }
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      Die(std::string("unknown argument ") + argv[i] + " (usage: bench_learning [--quick] [--only SECTION])");
    }
  }
  auto wanted = [&](const char* section) { return only.empty() || only == section; };
  // Tiny models: one thread is fastest, and the runs are bit-reproducible.
  torch::set_num_threads(1);
  const auto start = bench::Clock::now();
  std::printf("bench_learning%s: libtorch on 1 CPU thread, seed %llu\n", quick ? " --quick" : "",
              static_cast<unsigned long long>(kSeed));
  // Each section's process CPU time: on a shared machine it measures our work where wall time measures neighbours.
  auto timed = [](const std::function<void()>& section) {
    const double cpu = CpuSeconds();
    section();
    std::printf("(%.0f s CPU)\n", CpuSeconds() - cpu);
  };
  if (wanted("memory")) timed(AggregationMemory);
  if (wanted("synthetic")) timed([&] { SyntheticBenchmark(quick); });
  const Digits digits = LoadDigits();
  if (wanted("noniid")) timed([&] { DigitsNonIid(digits, quick); });
  if (wanted("robust")) timed([&] { DigitsRobustness(digits, quick); });
  if (wanted("dp")) timed([&] { DigitsDp(digits, quick); });
  if (wanted("ranks")) timed([&] { parsyn::bench::MixedLoraRanks(quick); });
  if (wanted("async")) timed([&] { parsyn::bench::AsyncVersusSync(digits, quick); });
  std::printf("\nbench_learning: %.0f s\n", bench::Seconds(bench::Clock::now() - start));
  return 0;
}
