#include "strategy/dp_fed_avg.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numbers>
#include <string>

#include "strategy/sampling.h"
#include "strategy/seed.h"

namespace parsyn::strategy {
namespace {

using weights::DType;
using weights::Tensor;
using weights::WeightSet;

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

StatusOr<WeightSet> StateOf(const RdpAccountant& accountant, double epsilon, const DpRoundReport& report) {
  WeightSet state;
  state.metadata()["strategy"] = "dp_fedavg";
  auto add_f64 = [&](const std::string& name, std::span<const double> values) -> Status {
    PARSYN_ASSIGN_OR_RETURN(std::span<std::byte> bytes,
                            state.AddZeros(name, DType::kF64, {static_cast<int64_t>(values.size())}));
    std::memcpy(bytes.data(), values.data(), values.size() * sizeof(double));
    return Status::Ok();
  };
  PARSYN_RETURN_IF_ERROR(add_f64("orders", accountant.orders()));
  PARSYN_RETURN_IF_ERROR(add_f64("rdp", accountant.rdp()));
  PARSYN_ASSIGN_OR_RETURN(std::span<std::byte> rounds, state.AddZeros("rounds", DType::kI64, {1}));
  const int64_t count = accountant.rounds();
  std::memcpy(rounds.data(), &count, sizeof(count));
  const double eps[] = {epsilon};
  PARSYN_RETURN_IF_ERROR(add_f64("epsilon", eps));
  const double last[] = {static_cast<double>(report.round),
                         static_cast<double>(report.participants),
                         static_cast<double>(report.clipped),
                         report.noise_stddev,
                         report.sampling_rate,
                         report.epsilon};
  PARSYN_RETURN_IF_ERROR(add_f64("last_round", last));
  return state;
}

}  // namespace

Status ValidateDpFedAvgOptions(const DpFedAvgOptions& options) {
  if (!std::isfinite(options.clip_norm) || options.clip_norm <= 0) {
    return InvalidArgumentError("clip_norm must be a finite number > 0, got " + Number(options.clip_norm));
  }
  if (!std::isfinite(options.noise_multiplier) || options.noise_multiplier < 0) {
    return InvalidArgumentError("noise_multiplier must be a finite number >= 0, got " +
                                Number(options.noise_multiplier));
  }
  if (!(options.delta > 0 && options.delta < 1)) {
    return InvalidArgumentError("delta must be a number in (0, 1), e.g. 1e-5, got " + Number(options.delta));
  }
  return Status::Ok();
}

DpFedAvg::DpFedAvg(DpFedAvgOptions options, const weights::SecretKey& private_key)
    : options_(options), private_key_(private_key) {
  assert(ValidateDpFedAvgOptions(options_).ok());
}

std::vector<ParticipantConfig> DpFedAvg::ConfigureRound(const RoundContext& ctx,
                                                        std::span<const Candidate> available) const {
  return ChooseParticipants(ctx, available, [this](int64_t round, int64_t shard) {
    return weights::KeyedRank(private_key_, kDpSampleDomain, static_cast<uint64_t>(round),
                              static_cast<uint64_t>(shard));
  });
}

StatusOr<RoundPlan> DpFedAvg::BeginRound(int round, const WeightSet& global) {
  for (const Tensor& t : global.tensors()) {
    if (!weights::IsFloat(t.dtype)) {
      return InvalidArgumentError("global tensor '" + t.name + "' has dtype " +
                                  std::string(weights::DTypeName(t.dtype)) +
                                  "; dp_fedavg aggregates float tensors only");
    }
  }
  round_ = round;
  pending_.reset();  // a retried round starts again from the committed accountant
  global_ = global.Clone();
  global.ReleasePages();  // the coordinator's global is a read-only mapping: only the copy stays resident
  // The deltas are summed in float32 whatever the model's dtype (a bf16 delta would lose most of its bits).
  bool same_layout = delta_.size() == global.size();
  for (size_t i = 0; same_layout && i < global.size(); ++i) {
    same_layout = delta_[i].name == global[i].name && delta_[i].shape == global[i].shape;
  }
  if (!same_layout) {
    delta_ = WeightSet();
    for (const Tensor& t : global.tensors()) {
      auto zeros = delta_.AddZeros(t.name, DType::kF32, t.shape);
      if (!zeros.ok()) return zeros.status();
    }
  }
  clipped_ = 0;
  return RoundPlan{.combination = Combination::kWeightedMean,
                   .weighted_by_sample_count = false,
                   .mean_options = {.accumulation = weights::Accumulation::kExact},
                   .transformed_layout = &delta_};
}

Status DpFedAvg::TransformUpdate(const WeightSet& update, const std::function<Status(const WeightSet&)>& add) {
  // Pass 1: the delta's norm over the whole update.
  double squared_norm = 0;
  for (size_t k = 0; k < update.size(); ++k) {
    const Tensor& u = update[k];
    const Tensor& g = global_[k];
    for (int64_t i = 0, n = u.numel(); i < n; ++i) {
      const double d = weights::LoadElement(u, i) - weights::LoadElement(g, i);
      squared_norm += d * d;
    }
  }
  if (!std::isfinite(squared_norm)) {
    return InvalidArgumentError("the update's distance from the global overflows a double");
  }
  const double norm = std::sqrt(squared_norm);
  const double scale = norm > options_.clip_norm ? options_.clip_norm / norm : 1.0;

  // Pass 2: the clipped delta, added to the exact sum.
  for (size_t k = 0; k < update.size(); ++k) {
    const Tensor& u = update[k];
    const Tensor& g = global_[k];
    const std::span<float> out = delta_[k].as<float>();
    for (int64_t i = 0, n = u.numel(); i < n; ++i)
      out[i] = static_cast<float>(scale * (weights::LoadElement(u, i) - weights::LoadElement(g, i)));
  }
  PARSYN_RETURN_IF_ERROR(add(delta_));
  if (scale < 1.0) ++clipped_;
  return Status::Ok();
}

double DpFedAvg::SamplingRate(int64_t participants, int64_t eligible_workers) const {
  if (eligible_workers <= 0 || eligible_workers <= participants) return 1.0;
  return static_cast<double>(participants) / static_cast<double>(eligible_workers);
}

StatusOr<WeightSet> DpFedAvg::FinishFromMean(WeightSet mean_delta, int participants) {  // Σ clip(Δ_i) / K, float32
  // With the noise from the workers, their mean carries it already (at least σ·C/K: secagg::WorkerNoiseStddev).
  const double stddev = options_.noise_multiplier * options_.clip_norm / participants;
  const double added_here = options_.noise_from_workers ? 0.0 : stddev;
  weights::GaussianStream noise(private_key_, kDpNoiseDomain, static_cast<uint64_t>(round_));
  WeightSet next;
  for (size_t k = 0; k < global_.size(); ++k) {
    const Tensor& g = global_[k];
    auto bytes = next.AddZeros(g.name, g.dtype, g.shape);
    if (!bytes.ok()) return bytes.status();
    const Tensor& out = next[k];
    const std::span<const float> mean = mean_delta[k].as<float>();
    for (int64_t i = 0, n = g.numel(); i < n; ++i) {
      weights::StoreElement(out, i,
                            weights::LoadElement(g, i) + static_cast<double>(mean[i]) +
                                (added_here > 0 ? added_here * noise.Next() : 0.0));
    }
  }
  global_ = WeightSet();

  const double q = SamplingRate(participants, eligible_workers_);
  Pending pending;
  pending.accountant = accountant_;
  pending.accountant.AddRounds(q, options_.noise_multiplier);
  pending.epsilon = pending.accountant.Epsilon(options_.delta).epsilon;
  pending.report = DpRoundReport{.round = round_,
                                 .participants = participants,
                                 .clipped = clipped_,
                                 .noise_stddev = stddev,
                                 .sampling_rate = q,
                                 .epsilon = pending.epsilon};
  PARSYN_ASSIGN_OR_RETURN(pending.state, StateOf(pending.accountant, pending.epsilon, pending.report));
  pending_ = std::move(pending);
  return next;
}

void DpFedAvg::CommitState() {
  if (!pending_) return;
  accountant_ = std::move(pending_->accountant);
  epsilon_spent_ = pending_->epsilon;
  last_round_ = pending_->report;
  pending_.reset();
}

StatusOr<DpAccountingState> ReadDpFedAvgState(const WeightSet& state) {
  auto label = state.metadata().find("strategy");
  if (label == state.metadata().end() || label->second != "dp_fedavg") {
    return InvalidArgumentError("the server state is " +
                                (label == state.metadata().end() ? std::string("unlabelled") : "of " + label->second) +
                                ", not of dp_fedavg");
  }
  DpAccountingState read;
  const size_t n = read.accountant.orders().size();
  const Tensor* orders = state.Find("orders");
  const Tensor* rdp = state.Find("rdp");
  const Tensor* rounds = state.Find("rounds");
  const Tensor* epsilon = state.Find("epsilon");
  const Tensor* last = state.Find("last_round");
  auto is = [](const Tensor* t, DType dtype, int64_t numel) {
    return t != nullptr && t->dtype == dtype && t->shape.size() == 1 && t->numel() == numel;
  };
  if (!is(orders, DType::kF64, static_cast<int64_t>(n)) || !is(rdp, DType::kF64, static_cast<int64_t>(n)) ||
      !is(rounds, DType::kI64, 1) || !is(epsilon, DType::kF64, 1) || !is(last, DType::kF64, 6)) {
    return InvalidArgumentError("the dp_fedavg state needs F64 tensors orders and rdp [" + std::to_string(n) +
                                "], I64 rounds [1], F64 epsilon [1] and F64 last_round [6]");
  }
  const std::span<const double> stored_orders = orders->as<double>();
  if (!std::equal(stored_orders.begin(), stored_orders.end(), read.accountant.orders().begin())) {
    return InvalidArgumentError("the dp_fedavg state was accounted over other RDP orders");
  }
  if (!read.accountant.Restore(rdp->as<double>(), rounds->as<int64_t>()[0])) {
    return InvalidArgumentError("the dp_fedavg state's round count is negative");
  }
  read.epsilon = epsilon->as<double>()[0];
  const std::span<const double> r = last->as<double>();
  if (read.accountant.rounds() > 0) {
    read.last_round = DpRoundReport{.round = static_cast<int>(r[0]),
                                    .participants = static_cast<int>(r[1]),
                                    .clipped = static_cast<int>(r[2]),
                                    .noise_stddev = r[3],
                                    .sampling_rate = r[4],
                                    .epsilon = r[5]};
  }
  return read;
}

Status DpFedAvg::RestoreState(const WeightSet* state) {
  pending_.reset();
  if (state == nullptr) {
    accountant_ = RdpAccountant();
    epsilon_spent_ = 0;
    last_round_.reset();
    return Status::Ok();
  }
  PARSYN_ASSIGN_OR_RETURN(DpAccountingState read, ReadDpFedAvgState(*state));
  accountant_ = std::move(read.accountant);
  epsilon_spent_ = read.epsilon;
  last_round_ = read.last_round;
  return Status::Ok();
}

void DpFedAvg::RecordPastRound(int64_t participants, int64_t eligible_workers) {
  if (participants <= 0) return;
  accountant_.AddRounds(SamplingRate(participants, eligible_workers), options_.noise_multiplier);
  epsilon_spent_ = accountant_.Epsilon(options_.delta).epsilon;
}

}  // namespace parsyn::strategy
