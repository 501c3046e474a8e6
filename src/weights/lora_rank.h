// LoRA adapters of different ranks: checking, padding, slicing and truncating an adapter's rank, and the weighted
// mean of adapters of different ranks computed in factored form (heterogeneous-rank federated LoRA).
//
// A LoRA adapter is a WeightSet whose LoRA tensors come in pairs (PEFT's names, lora_layout.h):
//   <prefix>.lora_A.weight  A: (r, in_features)      <prefix>.lora_B.weight  B: (out_features, r)
// of a float dtype (F32, BF16, F16 or F64), whose product dW = B A (out x in) is what the adapter adds to the layer.
// Every pair of one adapter has the same rank r. The set may hold other tensors too (not LoRA); they are copied, or
// averaged elementwise by FactoredLoraMean.
//
// The math (dense_linalg.h) runs in double, and each output value is rounded once to its tensor's dtype. No dense
// out x in matrix is ever formed: memory is O((out + in) * rank) per module. Results are bit-identical run to run
// and whatever options.num_threads is: modules are spread over threads, but each module's arithmetic is fixed.
// Functions here are pure and safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "weights/weight_set.h"

namespace parsyn::weights {

struct LoraMathOptions {
  int num_threads = 0;  // modules computed at once; 0: the machine's cores, at most 8
};

// The rank shared by every pair. InvalidArgument (naming the tensor and the numbers) for an adapter with no pair, a
// lora_A without its lora_B or the reverse, a LoRA tensor that is not 2-D, not of a float dtype or of rank 0, a
// pair whose A and B disagree on the rank, or pairs of different ranks.
StatusOr<int64_t> LoraRank(const WeightSet& adapter);

// Checks that `update` fits the layout of `global` up to its LoRA rank and returns the update's rank r: the same
// tensor names in the same order and the same dtypes (WeightSet::CheckSameLayout's rule and messages), non-LoRA
// tensors of the same shapes, LoRA tensors of the global's in/out features and one rank r for the whole update with
// 1 <= r <= the global's rank. InvalidArgument naming the first problem, e.g. "update's
// 'm.q_proj.lora_A.weight' has rank 32, above the job's maximum rank 16"; errors of LoraRank(global) come back
// prefixed with "global: ".
StatusOr<int64_t> CheckLoraLayoutUpToRank(const WeightSet& global, const WeightSet& update);

// The adapter at rank r >= its rank: A gains zero rows, B zero columns (the product is unchanged). Other tensors,
// dtypes, order and metadata are copied. InvalidArgument for r below the adapter's rank, or LoraRank's errors.
StatusOr<WeightSet> ZeroPadLoraRank(const WeightSet& adapter, int64_t r);

// The adapter extended to the rank of `donor` (an adapter of the same layout up to rank: CheckLoraLayoutUpToRank's
// rule), the ranks it lacks taken from the donor's same ranks: A's rows [rank, r) and B's columns [rank, r) are the
// donor's, byte for byte. When the adapter was trained from the donor's first ranks (a worker of a lower rank, from
// SliceLoraRank or TruncateLoraRank of the donor), this is the donor with those ranks trained and the others as they
// were. Other tensors, dtypes, order and metadata are the adapter's. CheckLoraLayoutUpToRank's errors.
StatusOr<WeightSet> ExtendLoraRank(const WeightSet& adapter, const WeightSet& donor);

// The adapter with every pair's product B·A scaled by `factor` (B's values multiplied, in double, rounded once; A
// as it was). Between ranks of one lora_alpha, PEFT's scaling alpha / r differs: a rank-r adapter's B·A adds to the
// model what r_max / r times it adds at rank r_max, so a worker of rank r starts from the global's ranks scaled by
// r / r_max and its update comes back scaled by r_max / r. InvalidArgument for a factor that is not finite and > 0,
// or LoraRank's errors. Other tensors, dtypes, order and metadata are copied.
StatusOr<WeightSet> ScaleLoraProducts(const WeightSet& adapter, double factor);

// The adapter's first r ranks: A's first r rows and B's first r columns, 1 <= r <= its rank. Other tensors, dtypes,
// order and metadata are copied. InvalidArgument for r out of range, or LoraRank's errors.
StatusOr<WeightSet> SliceLoraRank(const WeightSet& adapter, int64_t r);

// Each pair replaced by the best rank-r approximation of B A (Eckart-Young: ||BA - B'A'||_F^2 is the sum of the
// discarded squared singular values), computed from the factors: thin QR B = Q_B R_B and A^T = Q_A R_A, SVD
// R_B R_A^T = U S V^T (singular values descending, ties in index order), then B' = Q_B U_r S_r, A' = V_r^T Q_A^T.
// So A' always has orthonormal rows (a zero B, as in a fresh PEFT adapter, gives B' = 0 and an A' whose rows are an
// orthonormal basis of the span of A's first r rows) and B' carries the singular values. Where in_features < r,
// only in_features rows can be orthonormal: the rest of A' and B' are zero. Requires 1 <= r <= the rank
// (InvalidArgument otherwise, or LoraRank's errors). Non-LoRA tensors, dtypes, order and metadata are copied.
StatusOr<WeightSet> TruncateLoraRank(const WeightSet& adapter, int64_t r, const LoraMathOptions& options = {});

// One adapter of a weighted mean; `adapter` is borrowed for the call.
struct WeightedAdapter {
  const WeightSet* adapter = nullptr;
  double weight = 0;
};

// The new global at the global's rank r_max (heterogeneous-rank FedAvg for LoRA). For each pair, the weighted mean
// of the products dW = sum_i w_i B_i A_i / sum_i w_i over adapters of ranks r_i <= r_max, in factored form: with
// c_i = w_i / sum w, B_stack = [c_1 B_1 | c_2 B_2 | ...] (out x sum r_i) and A_stack = [A_1; A_2; ...] (sum r_i x in)
// have B_stack A_stack = dW, and TruncateLoraRank's steps applied to them keep the top r_max. Where sum r_i < r_max,
// the global's own factors join the stack with weight 0 (the product is unchanged) so that A still has r_max
// orthonormal rows. Hence:
//   - when sum r_i <= r_max, the result's B A equals the exact weighted mean of the products (up to rounding);
//   - otherwise it is that mean's best rank-r_max approximation (Frobenius and spectral norms).
// Non-LoRA float tensors: the weighted mean sum c_i x_i, in double, in the adapters' order. The result has the
// global's tensor order, dtypes and shapes, and no metadata. Memory: O((out + in) * sum r_i) per module being
// computed (a few at once), besides the result. InvalidArgument for no adapters, a null adapter, a weight that is
// not finite and > 0, an adapter that fails CheckLoraLayoutUpToRank (prefixed with "adapter #i"), a non-finite
// value in an adapter or in the global, or a non-float non-LoRA tensor.
StatusOr<WeightSet> FactoredLoraMean(std::span<const WeightedAdapter> adapters, const WeightSet& global,
                                     const LoraMathOptions& options = {});

}  // namespace parsyn::weights
