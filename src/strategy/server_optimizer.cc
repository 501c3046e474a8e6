#include "strategy/server_optimizer.h"

#include <cmath>
#include <string>

#include "strategy/sampling.h"

namespace parsyn::strategy {
namespace {

// Element i of a float tensor in fp32 (F64 narrowed: the server optimizers compute in fp32).
float Load(const weights::Tensor& t, int64_t i) { return static_cast<float>(weights::LoadElement(t, i)); }

float Sign(float x) { return x > 0 ? 1.0f : (x < 0 ? -1.0f : 0.0f); }  // as np.sign

}  // namespace

ServerOptimizer::ServerOptimizer(StrategyKind kind, const StrategyOptions& options, FedAvgOptions fed_avg)
    : kind_(kind), options_(options), fed_avg_(fed_avg) {}

std::vector<ParticipantConfig> ServerOptimizer::ConfigureRound(const RoundContext& ctx,
                                                               std::span<const Candidate> available) const {
  return ChooseParticipants(ctx, available);
}

StatusOr<RoundPlan> ServerOptimizer::BeginRound(int round, const weights::WeightSet& global) {
  pending_.reset();  // a round that was not committed leaves no trace
  if (state_) {
    // The restored state must be this global's: one fp32 tensor per moment and parameter, same shapes.
    const size_t moments = adaptive() ? 2 : 1;
    if (state_->size() != moments * global.size()) {
      return InvalidArgumentError("the " + std::string(name()) + " server state has " + std::to_string(state_->size()) +
                                  " tensors; the global needs " + std::to_string(moments * global.size()));
    }
    for (const weights::Tensor& t : global.tensors()) {
      for (const char* prefix : {"m/", "v/"}) {
        if (!adaptive() && std::string_view(prefix) == "m/") continue;
        const weights::Tensor* s = state_->Find(prefix + t.name);
        if (s == nullptr || s->dtype != weights::DType::kF32 || s->shape != t.shape) {
          return InvalidArgumentError("the " + std::string(name()) + " server state has no F32 tensor '" + prefix +
                                      t.name + "' of shape " + weights::ShapeString(t.shape));
        }
      }
    }
  }
  PARSYN_ASSIGN_OR_RETURN(RoundPlan plan, fed_avg_.BeginRound(round, global));  // also refuses non-float tensors
  global_ = global.Clone();
  global.ReleasePages();  // the coordinator's global is a read-only mapping: only the copy stays resident
  return plan;
}

StatusOr<weights::WeightSet> ServerOptimizer::FinishFromMean(weights::WeightSet mean, int /*count*/) {
  const weights::WeightSet& global = *global_;
  weights::WeightSet next;
  next.metadata()["strategy"] = std::string(name());
  // Zero moments for a job's first round (AddZeros), else a copy of the committed ones that is stepped in place.
  for (const weights::Tensor& t : global.tensors()) {
    for (const char* prefix : {"m/", "v/"}) {
      if (!adaptive() && std::string_view(prefix) == "m/") continue;
      const std::string key = prefix + t.name;
      PARSYN_ASSIGN_OR_RETURN(std::span<std::byte> bytes, next.AddZeros(key, weights::DType::kF32, t.shape));
      if (state_) {
        const weights::Tensor& old = *state_->Find(key);
        std::copy(old.data.begin(), old.data.end(), bytes.begin());
      }
    }
  }

  const float lr = static_cast<float>(options_.server_learning_rate);
  const float momentum = static_cast<float>(options_.server_momentum);
  const float b1 = static_cast<float>(options_.beta1);
  const float one_minus_b1 = static_cast<float>(1.0 - options_.beta1);
  const float b2 = static_cast<float>(options_.beta2);
  const float one_minus_b2 = static_cast<float>(1.0 - options_.beta2);
  const float tau = static_cast<float>(options_.tau);
  for (size_t k = 0; k < global.size(); ++k) {
    const weights::Tensor& g = global[k];
    const weights::Tensor& out = mean[k];  // the mean's bytes become the new global's
    std::span<float> v = next.Find("v/" + g.name)->as<float>();
    std::span<float> m = adaptive() ? next.Find("m/" + g.name)->as<float>() : std::span<float>();
    const int64_t n = g.numel();
    for (int64_t i = 0; i < n; ++i) {
      const float w = Load(g, i);
      const float delta = Load(out, i) - w;
      float step;
      if (kind_ == StrategyKind::kFedAvgM) {
        v[i] = momentum * v[i] + delta;
        step = lr * v[i];
      } else {
        m[i] = b1 * m[i] + one_minus_b1 * delta;
        const float delta2 = delta * delta;
        if (kind_ == StrategyKind::kFedAdam) {
          v[i] = b2 * v[i] + one_minus_b2 * delta2;
        } else if (kind_ == StrategyKind::kFedYogi) {
          v[i] = v[i] - one_minus_b2 * delta2 * Sign(v[i] - delta2);
        } else {  // kFedAdagrad
          v[i] = v[i] + delta2;
        }
        step = lr * m[i] / (std::sqrt(v[i]) + tau);
      }
      weights::StoreElement(out, i, w + step);
    }
  }
  PARSYN_RETURN_IF_ERROR(weights::CheckFinite(mean).WithContext(std::string(name()) + " step"));
  pending_ = std::move(next);
  global_.reset();
  return mean;
}

void ServerOptimizer::CommitState() {
  if (pending_) state_ = std::move(pending_);
  pending_.reset();
}

Status ServerOptimizer::RestoreState(const weights::WeightSet* state) {
  pending_.reset();
  if (state == nullptr) {
    state_.reset();
    return Status::Ok();
  }
  auto it = state->metadata().find("strategy");
  if (it == state->metadata().end() || it->second != name()) {
    return InvalidArgumentError("the server state is " +
                                (it == state->metadata().end() ? std::string("unlabelled") : "of " + it->second) +
                                ", not of " + std::string(name()));
  }
  state_ = state->Clone();  // its layout is checked against the global at Begin
  return Status::Ok();
}

}  // namespace parsyn::strategy
