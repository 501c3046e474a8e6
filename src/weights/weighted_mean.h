// Streaming weighted mean (FedAvg's aggregation): result = sum(n_i * w_i) / sum(n_i).
//
// Built from the global's layout; updates are accepted one at a time as they arrive, so memory is O(parameters)
// whatever the number of updates. Not thread-safe: one owner calls Accept/Finish (internally the work is spread over
// a few threads by chunk, and AcceptOwned adds a full batch of kept updates on a thread of its own, which every later
// call that needs the sums waits for).
//
// Two ways to sum, chosen by the size of the sums (one accumulator per parameter: 4, 8 or 16 bytes by accumulation):
// - Streaming (sums up to options.max_whole_sums_bytes): the sums are kept whole and each update is added as it
//   arrives (or a few at once, AcceptOwned), so Finish has little left to do. Memory: the sums, then the result.
// - Waiting on disk (larger sums): updates given to AcceptOwned read-only mapped from their files
//   (MapSafetensorsFileReadOnly) are validated, their pages handed back, and they wait in the page cache; Finish
//   then sums them chunk by chunk (64 Ki elements) with a per-chunk accumulator per thread, writing each chunk of the
//   result and dropping the updates' pages it read. Memory: the result (the model's own size) plus ~1.3 MiB per
//   thread and the pages in flight, whatever K and whatever the accumulation: a 14 GB bf16 model aggregates in
//   ~14 GB instead of 16 bytes x 7e9 parameters of sums. Updates that are not read-only mapped (or Accept, which
//   borrows its update) still need the whole sums: they are allocated then, and the mean streams from there on.
// Both add the same terms to each element in the order of acceptance, so they give the same bits; with kExact, the
// bits are also the same whatever that order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "base/status.h"
#include "weights/weight_set.h"

namespace parsyn::weights {

enum class Accumulation {
  // fp32 running sum (4 bytes per parameter): fastest; the result depends (in the last bits) on the order updates
  // arrive in. Error below ~K float ulps of sum(n_i * |w_i|) / N.
  kFloat32,
  // fp64 running sum (8 bytes per parameter): more precise; still order-dependent in the last bits.
  kFloat64,
  // Exact fixed-point sum (16 bytes per parameter): each n_i * w_i is computed in double, rounded once to a 2^-64
  // grid and summed in int128, so the sum, and the result, are bit-identical whatever the arrival order. Requires
  // n_i < 2^52 and |n_i * w_i| < 2^52; values below 2^-64 in magnitude are lost. Slower than
  // the float paths (scalar int128 adds). Use where reproducibility is asked for.
  kExact,
};

struct WeightedMeanOptions {
  Accumulation accumulation = Accumulation::kFloat32;
  int num_threads = 0;  // 0: a sensible default for this machine
  // AcceptOwned keeps up to this many bytes of updates (beyond one) before adding them in one pass.
  uint64_t max_deferred_bytes = uint64_t{128} << 20;
  // Sums up to this size are kept whole (streaming); beyond it, read-only mapped updates wait on disk and Finish sums
  // them chunk by chunk (see above). 256 MiB: kExact sums of 16 Mi parameters (a 64 MiB fp32 model).
  uint64_t max_whole_sums_bytes = uint64_t{256} << 20;
};

class WeightedMean {
 public:
  // `layout` gives the names, dtypes and shapes every update must have; its float tensors (F32, BF16, F16) are
  // averaged. Only its layout is read; it need not outlive the constructor.
  explicit WeightedMean(const WeightSet& layout, WeightedMeanOptions options = {});
  ~WeightedMean();
  WeightedMean(WeightedMean&&) noexcept;
  WeightedMean& operator=(WeightedMean&&) noexcept;

  // Adds `n * update`. InvalidArgument (and nothing is added) if the layout differs in any name, dtype or shape, a
  // value is not finite, a tensor is not F32/BF16/F16, n is not finite and > 0, or adding could overflow the
  // accumulator (e.g. fp32 with |n * w| sums near 3.4e38). The whole update is validated before any of it is added.
  Status Accept(const WeightSet& update, double n);

  // As Accept (same checks, same verdict, now), but the update is kept and added later, together with others, in
  // one pass over the sums: once the kept updates pass options.max_deferred_bytes (that batch is added on a thread
  // of its own while the next one fills; AcceptOwned waits only if the batch before is still being added), or at the
  // next Accept, AddKept or Finish. Adding K updates in one pass reads and writes the sums (16 bytes per parameter
  // for kExact) once instead of K times. The result is bit-identical to accepting the same updates one by one with
  // Accept, in the same order. Memory: up to two batches of max_deferred_bytes of updates (plus one) stay alive, as
  // owned by `update` (memory-mapped files stay mapped). With sums over max_whole_sums_bytes, an update's read-only
  // mapped bytes do not count toward max_deferred_bytes: their pages are handed back after validation and the update
  // waits for Finish.
  // `max_magnitude`: the largest |value| of the update, when a check that read every value and found them finite
  // (SafetensorsStreamChecker, as it was received) already knows it; the update's values are then not read until
  // they are added (the same verdict, one pass fewer).
  Status AcceptOwned(WeightSet update, double n, std::optional<double> max_magnitude = std::nullopt);

  // True when AcceptOwned(update, n, max_magnitude) with a known magnitude would return in microseconds: no pass
  // over its values, and no wait for a batch being added (it only keeps the update, or starts adding the batch it
  // fills on a thread of its own). A caller may accept such an update where a pass over it would be too long (the
  // coordinator's event loop).
  bool AcceptOwnedIsQuick(const WeightSet& update) const;

  // Adds the updates AcceptOwned kept, now, in one pass (nothing if none are kept): for a caller that is idle now
  // and would rather not leave that work to Finish. Nothing either while updates wait on disk (sums over
  // max_whole_sums_bytes, not allocated): adding them would allocate the sums.
  void AddKept();

  // True while no sums are allocated and the accepted updates wait for Finish to sum them chunk by chunk.
  bool waiting_on_disk() const;

  int num_accepted() const;
  double total_weight() const;

  // OK iff `layout` has this mean's names, dtypes and shapes (so Reset can serve a mean over it).
  Status CheckLayout(const WeightSet& layout) const;

  // Starts over with the same layout and options, nothing accepted (also after Finish). Reuses the sums' memory
  // (16 bytes per parameter for kExact: allocating and faulting it in anew costs ~50 ms per 20 MiB of fp32) unless
  // a result of Finish still holds it (kFloat32 results are views of it); then the sums take the memory of an
  // earlier result nobody holds any more (the global before last), or new memory. Sums over max_whole_sums_bytes are
  // freed instead (the next round's updates can wait on disk).
  void Reset();

  // The mean in the layout's dtypes (rounded to nearest even for BF16/F16). FailedPrecondition if nothing was
  // accepted. Consumes the sums (F32 results may reuse the accumulator's memory): Accept afterwards returns
  // FailedPrecondition.
  StatusOr<WeightSet> Finish() &&;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace parsyn::weights
