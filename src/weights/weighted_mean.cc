#include "weights/weighted_mean.h"

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "weights/buffer.h"
#include "weights/weighted_mean_kernels.h"

namespace parsyn::weights {
using namespace mean_kernels;  // this file's kernels (weighted_mean_kernels.h)

struct WeightedMean::Impl {
  struct Slot {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    size_t offset;  // into the flat accumulator, in elements
    size_t numel;
  };
  // A contiguous piece of one tensor, the unit of parallel work.
  struct Chunk {
    size_t slot;
    size_t begin;  // element index within the tensor
    size_t end;
  };

  WeightedMeanOptions options;
  std::vector<Slot> slots;
  std::vector<Chunk> chunks;
  size_t total_elements = 0;
  int num_accepted = 0;
  double total_weight = 0;
  __int128 exact_total_weight = 0;
  // Sum over accepted updates of n * max|w|: a bound on any accumulator's magnitude, checked before adding.
  double magnitude_bound = 0;
  bool finished = false;
  // The running sums, one per averaged element: float, double or int128 by options.accumulation.
  std::shared_ptr<std::byte> acc_storage;
  size_t acc_element_bytes = 0;
  template <typename T>
  T* acc() const {
    return reinterpret_cast<T*>(acc_storage.get());
  }

  // Updates accepted by AcceptOwned and not yet added, in acceptance order, and their total size.
  struct Deferred {
    WeightSet update;
    double n;
  };
  std::vector<Deferred> deferred;
  uint64_t deferred_bytes = 0;
  bool sums_written = false;  // false until the first update is added: it writes the sums instead of adding
  // A full batch of kept updates being added on `adder`, a thread of its own, while AcceptOwned judges and keeps the
  // next ones: the owner's thread (the coordinator's event loop) does not wait for the pass. Meanwhile only the
  // adder touches the sums and `adding`; everything else that reads or adds to the sums waits for it (WaitForAdd).
  std::vector<Deferred> adding;
  std::atomic<bool> add_done{true};
  std::jthread adder;

  ~Impl() { WaitForAdd(); }
  void WaitForAdd() {
    if (adder.joinable()) adder.join();
    adding.clear();  // the added updates' memory goes now
  }
  // True while the batch on `adder` is still being added.
  bool AddInFlight() const { return !add_done.load(std::memory_order_acquire); }

  Status CheckLayout(const WeightSet& update) const;
  // OK and the largest |w| in the update, or why it cannot be added (nothing has been added yet). With
  // `release_pages`, the update's read-only mapped pages are handed back (chunk by chunk as they are checked).
  // `known_max_abs`: the largest |w|, from a check that already read every value (found finite); no pass then.
  StatusOr<double> Validate(const WeightSet& update, double n, bool release_pages,
                            std::optional<double> known_max_abs = std::nullopt) const;
  // The largest |w| in the update in one parallel pass, or InvalidArgument naming a non-finite value.
  StatusOr<double> MaxMagnitude(const WeightSet& update, bool release_pages) const;
  // Validate, then counts the update in (weights and bounds); its values are added by AddDeferred.
  Status Count(const WeightSet& update, double n, bool release_pages = false,
               std::optional<double> known_max_abs = std::nullopt);
  // Sums larger than options.max_whole_sums_bytes are not allocated unless an update cannot wait on disk.
  bool SumsTooLarge() const { return total_elements * acc_element_bytes > options.max_whole_sums_bytes; }
  bool WaitingOnDisk() const { return !acc_storage && !finished; }
  // What keeping `update` adds to deferred_bytes: waiting on disk, only its pinned bytes (none when read-only mapped:
  // its pages go back as soon as they are checked).
  uint64_t KeptBytes(const WeightSet& update) const {
    return WaitingOnDisk() ? update.pinned_bytes() : update.total_bytes();
  }
  void AllocateSums() {
    if (!acc_storage) acc_storage = internal::AllocateZeroedBuffer(total_elements * acc_element_bytes);
  }
  // Adds n * (chunk c of `update`) to `sums`, which points at the chunk's first accumulator (whole sums or a
  // chunk-sized buffer).
  template <bool kFirst>
  void AddChunk(size_t c, const WeightSet& update, double n, std::byte* sums);
  // The bytes of chunk c in `update`.
  std::span<const std::byte> ChunkBytes(size_t c, const WeightSet& update) const {
    const Chunk& chunk = chunks[c];
    const Tensor& t = update[chunk.slot];
    const size_t element_bytes = DTypeSize(t.dtype);
    return std::span<const std::byte>(t.data).subspan(chunk.begin * element_bytes,
                                                      (chunk.end - chunk.begin) * element_bytes);
  }
  // Writes the means of chunk c, from its sums, into the result's tensor bytes `out` (in the tensor's dtype).
  void WriteMeans(size_t c, const std::byte* sums, std::byte* out, double inverse_total, long double exact_total) const;
  // Finish for updates that waited on disk: sums and divides chunk by chunk, no whole sums.
  StatusOr<WeightSet> FinishByChunk();
  // Adds the result's tensors to `result` and returns each slot's bytes: F32 slots as views of the accumulator when
  // `in_place_f32`, the others in one buffer (one mapping, its pages populated in one call: a buffer per tensor was a
  // memset and page faults each, ~27 ms a round for the 80 tensors of a 20 MiB LoRA update), an earlier result's
  // when nobody holds that any more (ReusedOrNewBuffer). Every element is written before anyone reads it.
  StatusOr<std::vector<std::span<std::byte>>> AddResultTensors(WeightSet& result, bool in_place_f32);
  // Buffers of results handed out by earlier Finishes, newest last, kept by a mean whose sums are whole in memory.
  // One that nobody else holds any more (the global before last) is written again instead of a new mapping, whose
  // first write faults every page in (a 20 MiB LoRA mean: ~24 ms of a K = 5 round's Finish on the PVM guest; 256 MiB
  // of fp32 sums: ~110 ms on the 2-core VM). Sums that a result views (kFloat32 on F32 tensors) are kept here too, and
  // Reset takes its new sums from here. Two of each size are kept, the global in use and the one before, so one
  // global's worth stays mapped between rounds. A mean over sums too large for memory keeps none: its bound counts
  // one result.
  std::vector<std::pair<std::shared_ptr<std::byte>, size_t>> handed_out;
  std::shared_ptr<std::byte> ReusedOrNewBuffer(size_t size_bytes);
  // Adds `buffer` to handed_out (nothing if it is there), dropping the oldest of its size beyond two.
  void KeepHandedOut(const std::shared_ptr<std::byte>& buffer, size_t size_bytes);
  // The deferred updates, then `extra` if given, in acceptance order.
  struct Term {
    const WeightSet* update;
    double n;
  };
  std::vector<Term> Batch(const WeightSet* extra = nullptr, double extra_n = 0) const;
  // Adds the batch's part of chunk c; the first term writes the sums instead if none was added before the batch.
  void AddBatchChunk(size_t c, const std::vector<Term>& batch, bool first_writes);
  // Adds the batch in one pass over the sums: each chunk of the sums takes the updates in acceptance order while it
  // is in cache, so the sums are read and written once per batch instead of once per update, and every element sees
  // the same additions in the same order as one Accept at a time would do.
  void AddTerms(const std::vector<Term>& batch, bool first_writes);
  // Adds every deferred update, then `extra` if given, in one pass (after the batch on `adder`, if any).
  void AddDeferred(const WeightSet* extra = nullptr, double extra_n = 0);
  // Moves the deferred updates to `adding` and adds them on `adder` (after the batch before them).
  void StartAddingDeferred();
};

WeightedMean::WeightedMean(const WeightSet& layout, WeightedMeanOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& impl = *impl_;
  if (options.num_threads <= 0) {
    options.num_threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  }
  impl.options = options;
  for (const Tensor& t : layout.tensors()) {
    const size_t numel = static_cast<size_t>(t.numel());
    const size_t slot = impl.slots.size();
    impl.slots.push_back({t.name, t.dtype, t.shape, impl.total_elements, numel});
    if (IsAveragedDtype(t.dtype)) {
      for (size_t begin = 0; begin < numel; begin += kChunkElements) {
        impl.chunks.push_back({slot, begin, std::min(numel, begin + kChunkElements)});
      }
      impl.total_elements += numel;
    }
  }
  impl.acc_element_bytes = options.accumulation == Accumulation::kFloat32   ? sizeof(float)
                           : options.accumulation == Accumulation::kFloat64 ? sizeof(double)
                                                                            : sizeof(__int128);
  if (!impl.SumsTooLarge()) impl.AllocateSums();
}

WeightedMean::~WeightedMean() = default;
WeightedMean::WeightedMean(WeightedMean&&) noexcept = default;
WeightedMean& WeightedMean::operator=(WeightedMean&&) noexcept = default;

Status WeightedMean::Impl::CheckLayout(const WeightSet& update) const {
  // Same rules and messages as WeightSet::CheckSameLayout, against the layout kept here without its bytes.
  PARSYN_RETURN_IF_ERROR(CheckLayoutMatches(slots, update));
  for (const Slot& slot : slots) {
    if (!IsAveragedDtype(slot.dtype)) {
      return InvalidArgumentError("tensor '" + slot.name + "' has dtype " + std::string(DTypeName(slot.dtype)) +
                                  "; only F32, BF16 and F16 tensors can be averaged");
    }
  }
  return Status::Ok();
}

StatusOr<double> WeightedMean::Impl::MaxMagnitude(const WeightSet& update, bool release_pages) const {
  // One parallel pass: the largest magnitude per chunk, as a float (Inf/NaN when the chunk holds one).
  std::vector<float> chunk_max(chunks.size(), 0.0f);
  ParallelFor(chunks.size(), options.num_threads, total_elements, [&](size_t c) {
    const Chunk& chunk = chunks[c];
    const Tensor& t = update[chunk.slot];
    const size_t count = chunk.end - chunk.begin;
    switch (t.dtype) {
      case DType::kF32:
        chunk_max[c] =
            std::bit_cast<float>(MaxMagnitudeBits<int32_t, 0x7fffffff>(t.as<int32_t>().data() + chunk.begin, count));
        break;
      case DType::kBF16:
        chunk_max[c] = Bf16Bits(MaxMagnitudeBits<int16_t, 0x7fff>(t.as<int16_t>().data() + chunk.begin, count));
        break;
      case DType::kF16:
        chunk_max[c] = F16Bits(MaxMagnitudeBits<int16_t, 0x7fff>(t.as<int16_t>().data() + chunk.begin, count));
        break;
      default: break;
    }
    if (release_pages) update.ReleasePages(ChunkBytes(c, update));
  });
  // The per-chunk releases leave about a page per chunk mapped (threads read neighbouring chunks; see FinishByChunk):
  // one more pass over the whole mapping (cheap where nothing is mapped) leaves none of the update resident.
  if (release_pages) update.ReleasePages();
  double max_abs = 0;
  for (float m : chunk_max) {
    if (!std::isfinite(m)) return CheckFinite(update);  // rescans to name the tensor and index
    max_abs = std::max(max_abs, static_cast<double>(m));
  }
  return max_abs;
}

StatusOr<double> WeightedMean::Impl::Validate(const WeightSet& update, double n, bool release_pages,
                                              std::optional<double> known_max_abs) const {
  if (!std::isfinite(n) || n <= 0) {
    return InvalidArgumentError("update weight n = " + std::to_string(n) + " must be finite and > 0");
  }
  PARSYN_RETURN_IF_ERROR(CheckLayout(update));
  double max_abs = 0;
  if (known_max_abs) {
    max_abs = *known_max_abs;
    if (release_pages) update.ReleasePages();
  } else {
    PARSYN_ASSIGN_OR_RETURN(max_abs, MaxMagnitude(update, release_pages));
  }

  const double limit = MaxAccumulatorMagnitude(options.accumulation);
  if (options.accumulation == Accumulation::kExact && (n >= kExactMaxTerm || n * max_abs >= kExactMaxTerm)) {
    return InvalidArgumentError("update too large for exact accumulation: n = " + std::to_string(n) +
                                ", max |w| = " + std::to_string(max_abs) + " (n and n * |w| must stay below 2^52)");
  }
  if (options.accumulation == Accumulation::kFloat32 && n > std::numeric_limits<float>::max()) {
    return InvalidArgumentError("update weight n = " + std::to_string(n) + " does not fit the fp32 accumulation");
  }
  // The exact sum of the weights shares the int128 grid, so it is bounded the same way.
  const bool weights_overflow = options.accumulation == Accumulation::kExact && total_weight + n >= kExactMaxSum;
  if (magnitude_bound + n * max_abs > limit || weights_overflow) {
    return InvalidArgumentError("accepting this update could overflow the accumulator (sum of n * max|w| would reach " +
                                std::to_string(magnitude_bound + n * max_abs) + "); use a wider accumulation");
  }
  return max_abs;
}

template <bool kFirst>
void WeightedMean::Impl::AddChunk(size_t c, const WeightSet& update, double n, std::byte* sums_bytes) {
  const Chunk& chunk = chunks[c];
  const Tensor& t = update[chunk.slot];
  const size_t count = chunk.end - chunk.begin;
  const float* f32 = t.dtype == DType::kF32 ? t.as<float>().data() + chunk.begin : nullptr;
  const uint16_t* u16 = t.dtype != DType::kF32 ? t.as<uint16_t>().data() + chunk.begin : nullptr;
  switch (options.accumulation) {
    case Accumulation::kFloat32: {
      float* sums = reinterpret_cast<float*>(sums_bytes);
      const float scale = static_cast<float>(n);
      if (t.dtype == DType::kF32) Accumulate<kFirst>(sums, f32, count, scale, LoadF32);
      if (t.dtype == DType::kBF16) Accumulate<kFirst>(sums, u16, count, scale, LoadBf16);
      if (t.dtype == DType::kF16) Accumulate<kFirst>(sums, u16, count, scale, LoadF16);
      break;
    }
    case Accumulation::kFloat64: {
      double* sums = reinterpret_cast<double*>(sums_bytes);
      if (t.dtype == DType::kF32) Accumulate<kFirst>(sums, f32, count, n, LoadF32);
      if (t.dtype == DType::kBF16) Accumulate<kFirst>(sums, u16, count, n, LoadBf16);
      if (t.dtype == DType::kF16) Accumulate<kFirst>(sums, u16, count, n, LoadF16);
      break;
    }
    case Accumulation::kExact: {
      __int128* sums = reinterpret_cast<__int128*>(sums_bytes);
      if (t.dtype == DType::kF32) {
        size_t done = 0;
#if defined(__x86_64__) && defined(__GNUC__)
        if (HasAvx512Dq()) done = AccumulateExactF32Avx512<kFirst>(sums, f32, count, n);
#endif
        AccumulateExact<kFirst>(sums + done, f32 + done, count - done, n, LoadF32);
      }
      if (t.dtype == DType::kBF16) AccumulateExact<kFirst>(sums, u16, count, n, LoadBf16);
      if (t.dtype == DType::kF16) AccumulateExact<kFirst>(sums, u16, count, n, LoadF16);
      break;
    }
  }
}

std::vector<WeightedMean::Impl::Term> WeightedMean::Impl::Batch(const WeightSet* extra, double extra_n) const {
  std::vector<Term> batch;
  for (const Deferred& d : deferred) batch.push_back({&d.update, d.n});
  if (extra != nullptr) batch.push_back({extra, extra_n});
  return batch;
}

void WeightedMean::Impl::AddBatchChunk(size_t c, const std::vector<Term>& batch, bool first_writes) {
  const Chunk& chunk = chunks[c];
  std::byte* sums = acc_storage.get() + (slots[chunk.slot].offset + chunk.begin) * acc_element_bytes;
  for (size_t j = 0; j < batch.size(); ++j) {
    if (j == 0 && first_writes) {
      AddChunk<true>(c, *batch[j].update, batch[j].n, sums);
    } else {
      AddChunk<false>(c, *batch[j].update, batch[j].n, sums);
    }
  }
}

void WeightedMean::Impl::AddTerms(const std::vector<Term>& batch, bool first_writes) {
  // One call per update maps its pages, instead of a fault per 64 KiB in the adding threads (a batch of 64 x 2 MiB
  // read-only mapped updates: 45-60 ms instead of 65-85 ms on the 2-core VM).
  for (const Term& term : batch) term.update->PopulatePages();
  ParallelFor(chunks.size(), options.num_threads, total_elements,
              [&](size_t c) { AddBatchChunk(c, batch, first_writes); });
}

void WeightedMean::Impl::AddDeferred(const WeightSet* extra, double extra_n) {
  WaitForAdd();
  const std::vector<Term> batch = Batch(extra, extra_n);
  if (batch.empty()) return;
  AllocateSums();  // from here on the mean streams
  AddTerms(batch, !sums_written);
  sums_written = true;
  deferred.clear();
  deferred_bytes = 0;
}

void WeightedMean::Impl::StartAddingDeferred() {
  WaitForAdd();
  if (deferred.empty()) return;
  AllocateSums();
  adding = std::move(deferred);
  deferred.clear();
  deferred_bytes = 0;
  const bool first_writes = !sums_written;
  sums_written = true;  // by the time anything reads the sums, it has waited for this batch
  add_done.store(false, std::memory_order_release);
  adder = std::jthread([this, first_writes] {
    std::vector<Term> batch;
    for (const Deferred& d : adding) batch.push_back({&d.update, d.n});
    AddTerms(batch, first_writes);
    add_done.store(true, std::memory_order_release);
  });
}

Status WeightedMean::Impl::Count(const WeightSet& update, double n, bool release_pages,
                                 std::optional<double> known_max_abs) {
  // Everything that can reject the update runs before anything is counted or added, so a rejected update leaves
  // the mean untouched.
  if (finished) return FailedPreconditionError("WeightedMean::Accept after Finish");
  PARSYN_ASSIGN_OR_RETURN(double max_abs, Validate(update, n, release_pages, known_max_abs));
  magnitude_bound += n * max_abs;
  total_weight += n;
  if (options.accumulation == Accumulation::kExact) exact_total_weight += ToFixed(n);
  ++num_accepted;
  return Status::Ok();
}

Status WeightedMean::Accept(const WeightSet& update, double n) {
  Impl& impl = *impl_;
  PARSYN_RETURN_IF_ERROR(impl.Count(update, n));
  impl.AddDeferred(&update, n);  // with any deferred ones first, to keep the order of acceptance
  return Status::Ok();
}

Status WeightedMean::AcceptOwned(WeightSet update, double n, std::optional<double> max_magnitude) {
  Impl& impl = *impl_;
  PARSYN_RETURN_IF_ERROR(impl.Count(update, n, /*release_pages=*/impl.WaitingOnDisk(), max_magnitude));
  impl.deferred_bytes += impl.KeptBytes(update);
  impl.deferred.push_back({std::move(update), n});
  if (impl.deferred_bytes > impl.options.max_deferred_bytes) impl.StartAddingDeferred();
  return Status::Ok();
}

bool WeightedMean::AcceptOwnedIsQuick(const WeightSet& update) const {
  const Impl& impl = *impl_;
  if (impl.finished) return true;  // refused at once
  // Kept; or a full batch that starts adding on its own thread, unless it would wait for the batch before.
  return impl.deferred_bytes + impl.KeptBytes(update) <= impl.options.max_deferred_bytes || !impl.AddInFlight();
}

int WeightedMean::num_accepted() const { return impl_->num_accepted; }

void WeightedMean::AddKept() {
  if (!impl_->finished && !impl_->WaitingOnDisk()) impl_->AddDeferred();
}

bool WeightedMean::waiting_on_disk() const { return impl_->WaitingOnDisk(); }

Status WeightedMean::CheckLayout(const WeightSet& layout) const { return impl_->CheckLayout(layout); }

void WeightedMean::Reset() {
  Impl& impl = *impl_;
  impl.WaitForAdd();
  impl.num_accepted = 0;
  impl.total_weight = 0;
  impl.exact_total_weight = 0;
  impl.magnitude_bound = 0;
  impl.finished = false;
  impl.deferred.clear();
  impl.deferred_bytes = 0;
  // The first update added writes every element of the sums, so stale sums need no clearing.
  impl.sums_written = false;
  if (impl.SumsTooLarge()) {
    impl.acc_storage.reset();  // the next round's updates can wait on disk; AllocateSums brings the sums back if not
    impl.handed_out.clear();
  } else if (impl.acc_storage.use_count() > 1) {
    // A result of Finish views the sums (kFloat32 sums of F32 tensors): the sums become the buffer of a result
    // nobody holds any more (the global before last), or new ones. The new ones join the results' buffers, as they
    // will be handed out.
    impl.acc_storage.reset();
    impl.acc_storage = impl.ReusedOrNewBuffer(impl.total_elements * impl.acc_element_bytes);
  }
}
double WeightedMean::total_weight() const { return impl_->total_weight; }

StatusOr<WeightSet> WeightedMean::Finish() && {
  Impl& impl = *impl_;
  if (impl.num_accepted == 0) return FailedPreconditionError("weighted mean of zero updates: nothing was accepted");
  impl.WaitForAdd();
  if (!impl.acc_storage) return impl.FinishByChunk();
  impl.finished = true;
  // Updates still deferred are added chunk by chunk in the dividing pass below, so each chunk of the sums is
  // divided while it is still in cache.
  const std::vector<Impl::Term> batch = impl.Batch();
  const bool first_writes = !impl.sums_written;
  // F32 tensors summed in fp32 are divided in place and handed over as views of the accumulator: no second buffer
  // and no extra pass. Other combinations write into new buffers.
  const bool in_place_f32 = impl.options.accumulation == Accumulation::kFloat32;
  WeightSet result;
  PARSYN_ASSIGN_OR_RETURN(const std::vector<std::span<std::byte>> outputs, impl.AddResultTensors(result, in_place_f32));
  // kExact divides the exact integer sums in 80-bit long double: the quotient is a function of the two integers
  // only, so the result stays order-independent. The float paths multiply by 1/N in double (vectorised, and within
  // a double ulp of dividing, far below the float result's rounding).
  const double inverse_total = 1.0 / impl.total_weight;
  const long double exact_total = ToLongDouble(impl.exact_total_weight);
  ParallelFor(impl.chunks.size(), impl.options.num_threads, impl.total_elements, [&](size_t c) {
    impl.AddBatchChunk(c, batch, first_writes);
    const Impl::Chunk& chunk = impl.chunks[c];
    const Impl::Slot& slot = impl.slots[chunk.slot];
    const size_t count = chunk.end - chunk.begin;
    const size_t at = slot.offset + chunk.begin;
    if (in_place_f32 && slot.dtype == DType::kF32) {
      ScaleInPlace(impl.acc<float>() + at, count, inverse_total);
      return;
    }
    impl.WriteMeans(c, impl.acc_storage.get() + at * impl.acc_element_bytes, outputs[chunk.slot].data(), inverse_total,
                    exact_total);
  });
  impl.sums_written = true;
  impl.deferred.clear();  // the kept updates' memory goes now
  impl.deferred_bytes = 0;
  return result;
}

void WeightedMean::Impl::WriteMeans(size_t c, const std::byte* sums_bytes, std::byte* out, double inverse_total,
                                    long double exact_total) const {
  const Chunk& chunk = chunks[c];
  const Slot& slot = slots[chunk.slot];
  const size_t count = chunk.end - chunk.begin;
  // The chunk's means as float first, then converted to the tensor's dtype: two plain loops.
  thread_local std::vector<float> means;
  means.resize(count);
  switch (options.accumulation) {
    case Accumulation::kFloat32:
      ScaleToFloat(reinterpret_cast<const float*>(sums_bytes), means.data(), count, inverse_total);
      break;
    case Accumulation::kFloat64:
      ScaleToFloat(reinterpret_cast<const double*>(sums_bytes), means.data(), count, inverse_total);
      break;
    case Accumulation::kExact: {
      const __int128* sums = reinterpret_cast<const __int128*>(sums_bytes);
      size_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
      if (HasAvx512Dq()) i = ExactMeansAvx512(sums, means.data(), count, exact_total);
#endif
      for (; i < count; ++i) means[i] = static_cast<float>(ToLongDouble(sums[i]) / exact_total);
      break;
    }
  }
  switch (slot.dtype) {
    case DType::kF32: std::memcpy(reinterpret_cast<float*>(out) + chunk.begin, means.data(), count * 4); break;
    case DType::kBF16: {
      uint16_t* dst = reinterpret_cast<uint16_t*>(out) + chunk.begin;
      for (size_t i = 0; i < count; ++i) dst[i] = FiniteFloatToBf16(means[i]);
      break;
    }
    case DType::kF16: {
      uint16_t* dst = reinterpret_cast<uint16_t*>(out) + chunk.begin;
      for (size_t i = 0; i < count; ++i) dst[i] = FloatToF16(means[i]);
      break;
    }
    default: break;
  }
}

std::shared_ptr<std::byte> WeightedMean::Impl::ReusedOrNewBuffer(size_t size_bytes) {
  for (auto it = handed_out.begin(); it != handed_out.end(); ++it) {
    if (it->second != size_bytes || it->first.use_count() != 1) continue;
    // Pairs with the release by which its last other holder let go: that holder's reads come before these writes.
    std::atomic_thread_fence(std::memory_order_acquire);
    std::rotate(it, std::next(it), handed_out.end());  // now the newest
    return handed_out.back().first;
  }
  std::shared_ptr<std::byte> buffer = internal::AllocateZeroedBuffer(size_bytes);
  KeepHandedOut(buffer, size_bytes);
  return buffer;
}

void WeightedMean::Impl::KeepHandedOut(const std::shared_ptr<std::byte>& buffer, size_t size_bytes) {
  for (const auto& kept : handed_out) {
    if (kept.first == buffer) return;
  }
  // Two of each size: the global in use and the one before (a result's buffer and the sums its F32 tensors view
  // differ in size).
  constexpr size_t kKeptPerSize = 2;
  const auto same_size = [size_bytes](const auto& kept) { return kept.second == size_bytes; };
  if (std::count_if(handed_out.begin(), handed_out.end(), same_size) == kKeptPerSize) {
    handed_out.erase(std::find_if(handed_out.begin(), handed_out.end(), same_size));
  }
  handed_out.emplace_back(buffer, size_bytes);
}

StatusOr<std::vector<std::span<std::byte>>> WeightedMean::Impl::AddResultTensors(WeightSet& result, bool in_place_f32) {
  auto is_view = [&](const Slot& slot) { return in_place_f32 && slot.dtype == DType::kF32; };
  std::vector<size_t> offsets;
  size_t total_bytes = 0;
  for (const Slot& slot : slots) {
    offsets.push_back(total_bytes);
    if (!is_view(slot)) total_bytes += internal::AlignedSize(slot.numel * DTypeSize(slot.dtype));
  }
  const std::shared_ptr<std::byte> buffer =
      acc_storage ? ReusedOrNewBuffer(total_bytes) : internal::AllocateZeroedBuffer(total_bytes);
  std::vector<std::span<std::byte>> outputs;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& slot = slots[i];
    if (is_view(slot)) {
      KeepHandedOut(acc_storage, total_elements * acc_element_bytes);  // Reset may take it back once it is free
      std::span<std::byte> view(acc_storage.get() + slot.offset * sizeof(float), slot.numel * sizeof(float));
      PARSYN_RETURN_IF_ERROR(result.AddView(slot.name, slot.dtype, slot.shape, view, acc_storage));
      outputs.push_back(view);
    } else {
      std::span<std::byte> bytes(buffer.get() + offsets[i], slot.numel * DTypeSize(slot.dtype));
      PARSYN_RETURN_IF_ERROR(result.AddView(slot.name, slot.dtype, slot.shape, bytes, buffer));
      outputs.push_back(bytes);
    }
  }
  return outputs;
}

StatusOr<WeightSet> WeightedMean::Impl::FinishByChunk() {
  finished = true;
  WeightSet result;
  PARSYN_ASSIGN_OR_RETURN(const std::vector<std::span<std::byte>> outputs,
                          AddResultTensors(result, /*in_place_f32=*/false));
  const std::vector<Term> batch = Batch();
  const double inverse_total = 1.0 / total_weight;
  const long double exact_total = ToLongDouble(exact_total_weight);
  // In waves of chunks. After each wave its pages of every update are released once more, from this thread once the
  // wave's readers are done: the per-chunk releases, with threads reading neighbouring chunks, left about a page per
  // chunk mapped (measured: 18 MiB per GiB of update), which over the whole model would add up to ~2% of K updates.
  constexpr size_t kWaveChunks = 256;
  for (size_t wave = 0; wave < chunks.size(); wave += kWaveChunks) {
    const size_t wave_end = std::min(chunks.size(), wave + kWaveChunks);
    ParallelFor(wave_end - wave, options.num_threads, total_elements, [&](size_t i) {
      const size_t c = wave + i;
      // This thread's sums for one chunk: 1 MiB for kExact, reused chunk after chunk.
      thread_local std::vector<std::byte> sums;
      sums.resize(kChunkElements * acc_element_bytes);
      for (size_t j = 0; j < batch.size(); ++j) {
        if (j == 0) {
          AddChunk<true>(c, *batch[j].update, batch[j].n, sums.data());
        } else {
          AddChunk<false>(c, *batch[j].update, batch[j].n, sums.data());
        }
        batch[j].update->ReleasePages(ChunkBytes(c, *batch[j].update));  // read once; the page cache keeps it
      }
      WriteMeans(c, sums.data(), outputs[chunks[c].slot].data(), inverse_total, exact_total);
    });
    for (const Term& term : batch) {
      for (size_t c = wave; c < wave_end; ++c) term.update->ReleasePages(ChunkBytes(c, *term.update));
    }
  }
  deferred.clear();
  deferred_bytes = 0;
  return result;
}

}  // namespace parsyn::weights
