// bench_secagg: a secure-aggregation round (src/secagg: every phase of every worker and of the coordinator, in
// process, messages through their JSON and wire forms) against plain FedAvg of the same quantized updates, in one run.
//
// For K workers and P parameters, with a fraction of the workers dropping after sharing keys (before their masked
// input, the costliest phase to recover from), it prints:
//   - the coordinator's time (secure: forwarding, the running sum, rebuilding secrets, taking masks off, dequantizing;
//     plain: weights::WeightedMean over the same updates dequantized to fp32, as the coordinator averages them);
//   - one worker's added time (quantizing, keys, shares, masking; the slowest of the K): workers run in parallel on
//     their own machines, so the round's wall time is the coordinator's time plus the slowest worker's;
//   - bytes per worker per round (upload: keys, shares, the masked vector, revealed shares; download: neighbors'
//     keys, shares, survivors) against plain fp32's upload of the update;
//   - the process's peak RSS per case (the workers run one after another, so it is the coordinator's sum plus one
//     worker's vectors: flat in K if unmasking streams).
// Each unmasked sum is checked against the plain sum of the survivors' quantized inputs; a mismatch fails the run.
//
// Usage: bench_secagg [--quick]   (--quick: P = 1M only)
#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_support.h"
#include "secagg/client.h"
#include "secagg/quantization.h"
#include "secagg/ring.h"
#include "secagg/server.h"
#include "weights/weighted_mean.h"

namespace parsyn::bench {
namespace {

using nlohmann::json;
using secagg::Client;
using secagg::Key32;
using secagg::Server;

void Check(const Status& status, const std::string& what) {
  if (!status.ok()) Die(what + ": " + status.ToString());
}

struct Case {
  size_t workers = 10;
  size_t params = 1'000'000;
  int bits = 16;
  double dropout = 0.1;
};

struct SecureRun {
  double coordinator_s = 0;
  double slowest_worker_s = 0;
  double upload_bytes = 0;                          // per surviving worker, mean (all its phases)
  double download_bytes = 0;                        // per surviving worker, mean
  std::map<uint64_t, double> uploaded, downloaded;  // by worker
  size_t coordinator_masks = 0;                     // masks the coordinator expanded to unmask
  std::vector<uint64_t> survivors;
};

// Each worker's update is the same values (drawn once), rounded with its own key: inputs differ, cost does not.
Key32 RoundingKey(uint64_t worker) { return secagg::DeriveKey(std::to_string(worker), "bench_secagg rounding"); }
double Weight(uint64_t worker) { return 0.5 + 0.5 * static_cast<double>(worker % 7) / 7.0; }

std::vector<uint32_t> Quantized(const std::vector<float>& update, uint64_t worker, const Case& c) {
  return Must(secagg::QuantizeUpdate(update, Weight(worker), {c.bits, 1.0}, RoundingKey(worker)), "quantize");
}

template <typename T>
size_t JsonBytes(const std::vector<T>& items) {
  json array = json::array();
  for (const T& item : items) array.push_back(secagg::ToJson(item));
  return array.dump().size();
}

// Times `work`, adding the seconds to `total`.
template <typename Work>
auto Timed(double& total, Work&& work) {
  const auto start = Clock::now();
  if constexpr (std::is_void_v<decltype(work())>) {
    work();
    total += Seconds(Clock::now() - start);
  } else {
    auto result = work();
    total += Seconds(Clock::now() - start);
    return result;
  }
}

// Phases 1 and 2 for every worker: keys advertised, then shares sealed and forwarded.
void AdvertiseAndShare(Server& server, std::map<uint64_t, Client>& clients, std::map<uint64_t, double>& worker_s,
                       SecureRun& run) {
  const secagg::RoundSetup& setup = server.setup();
  for (uint64_t id : setup.participants) {
    Client client = Timed(worker_s[id], [&] { return Must(Client::Start(setup, id, {}), "start"); });
    run.uploaded[id] += static_cast<double>(secagg::ToJson(client.advertised()).dump().size());
    Timed(run.coordinator_s, [&] { Check(server.AddAdvertisedKeys(id, client.advertised(), nullptr), "keys"); });
    clients.emplace(id, std::move(client));
  }
  Timed(run.coordinator_s, [&] { Check(server.EndAdvertising(), "end of advertising"); });
  for (auto& [id, client] : clients) {
    const auto keys = Timed(run.coordinator_s, [&] { return server.KeysFor(id); });
    run.downloaded[id] += static_cast<double>(JsonBytes(keys));
    const auto shares = Timed(worker_s[id], [&] { return Must(client.ShareKeys(keys, nullptr), "share keys"); });
    run.uploaded[id] += static_cast<double>(JsonBytes(shares));
    Timed(run.coordinator_s, [&] { Check(server.AddSealedShares(id, shares), "shares"); });
  }
  Timed(run.coordinator_s, [&] { Check(server.EndSharing(), "end of sharing"); });
}

// Every (K / dropped)-th worker: those that drop after sharing their keys.
std::set<uint64_t> DroppingWorkers(const std::vector<uint64_t>& participants, double dropout) {
  const size_t count = static_cast<size_t>(dropout * static_cast<double>(participants.size()) + 0.5);
  std::set<uint64_t> out;
  for (size_t i = 0; i < count; ++i) out.insert(participants[i * participants.size() / count]);
  return out;
}

// Phase 3: the workers that do not drop quantize and mask their updates; the coordinator sums them as they come.
void MaskedInputs(Server& server, std::map<uint64_t, Client>& clients, const std::vector<float>& update, const Case& c,
                  std::map<uint64_t, double>& worker_s, std::vector<uint32_t>& expected, SecureRun& run) {
  const int ring_bits = server.setup().ring_bits;
  const std::set<uint64_t> dropping = DroppingWorkers(server.setup().participants, c.dropout);
  for (auto& [id, client] : clients) {
    const auto shares = Timed(run.coordinator_s, [&] { return server.SharesFor(id); });
    run.downloaded[id] += static_cast<double>(JsonBytes(shares));
    if (dropping.count(id)) continue;
    std::vector<uint32_t> input = Timed(worker_s[id], [&] { return Quantized(update, id, c); });
    secagg::AddInto(expected, input, ring_bits);
    const auto masked = Timed(worker_s[id], [&] { return Must(client.MaskInput(shares, std::move(input)), "mask"); });
    const std::string wire = secagg::PackRing(masked, ring_bits);
    run.uploaded[id] += static_cast<double>(wire.size());
    Timed(run.coordinator_s, [&] { Check(server.AddMaskedInput(id, wire), "masked input"); });
    run.survivors.push_back(id);
  }
  Timed(run.coordinator_s, [&] { Check(server.EndMasking(), "end of masked input"); });
}

// Phase 4: the survivors reveal their shares; the coordinator takes the masks off and dequantizes the mean.
std::vector<uint32_t> Unmask(Server& server, std::map<uint64_t, Client>& clients, const Case& c,
                             std::map<uint64_t, double>& worker_s, SecureRun& run) {
  const std::vector<uint64_t> survivors = server.survivors();
  const double survivors_bytes = static_cast<double>(json(survivors).dump().size());
  for (uint64_t id : survivors) {
    run.downloaded[id] += survivors_bytes;
    const auto revealed = Timed(worker_s[id], [&] { return Must(clients.at(id).Unmask(survivors), "reveal"); });
    run.uploaded[id] += static_cast<double>(JsonBytes(revealed));
    Timed(run.coordinator_s, [&] { Check(server.AddRevealedShares(id, revealed), "revealed shares"); });
  }
  std::vector<uint32_t> sum = Timed(run.coordinator_s, [&] { return Must(server.Unmask(), "unmask"); });
  Timed(run.coordinator_s, [&] {
    (void)Must(secagg::DequantizeMean(sum, survivors.size(), {c.bits, 1.0}), "dequantize");
  });
  return sum;
}

SecureRun RunSecure(const Case& c, const std::vector<float>& update) {
  std::vector<uint64_t> ids(c.workers);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i + 1;
  const secagg::RoundSetup setup = Must(
      secagg::MakeRoundSetup("bench", ids, secagg::DefaultThreshold(c.workers), secagg::DefaultNeighbors(c.workers),
                             c.bits, 1.0, c.params + 1, secagg::DeriveKey("graph", "bench_secagg")),
      "setup");
  Server server = Must(Server::Start(setup), "server");
  std::map<uint64_t, Client> clients;
  std::map<uint64_t, double> worker_s;
  SecureRun run;
  AdvertiseAndShare(server, clients, worker_s, run);
  std::vector<uint32_t> expected(c.params + 1, 0);
  MaskedInputs(server, clients, update, c, worker_s, expected, run);
  if (Unmask(server, clients, c, worker_s, run) != expected) {
    Die("the unmasked sum is not the plain sum of the survivors' quantized inputs");
  }
  for (const auto& [id, seconds] : worker_s) run.slowest_worker_s = std::max(run.slowest_worker_s, seconds);
  for (uint64_t id : run.survivors) {
    run.upload_bytes += run.uploaded[id] / static_cast<double>(run.survivors.size());
    run.download_bytes += run.downloaded[id] / static_cast<double>(run.survivors.size());
  }
  run.coordinator_masks = run.survivors.size();
  for (uint64_t id : DroppingWorkers(ids, c.dropout)) {
    for (uint64_t neighbor : secagg::Neighbors(setup, id)) {
      run.coordinator_masks += std::count(run.survivors.begin(), run.survivors.end(), neighbor) > 0;
    }
  }
  return run;
}

// Plain FedAvg of the survivors' same quantized updates, dequantized to fp32 (untimed) and averaged by the
// coordinator's kernel: Accept (which adds at once; AcceptOwned would add on a thread of its own while the untimed
// dequantizing runs, hiding the work), then Finish.
double RunPlain(const Case& c, const std::vector<float>& update, const std::vector<uint64_t>& survivors) {
  weights::WeightSet layout;
  Check(layout.AddZeros("w", weights::DType::kF32, {static_cast<int64_t>(c.params)}).status(), "layout");
  weights::WeightedMean mean(layout);
  double seconds = 0;
  const double levels = std::ldexp(1.0, c.bits) - 1;
  for (uint64_t id : survivors) {
    const std::vector<uint32_t> q = Quantized(update, id, c);
    weights::WeightSet plain;
    auto bytes = Must(plain.AddZeros("w", weights::DType::kF32, {static_cast<int64_t>(c.params)}), "update");
    auto* values = reinterpret_cast<float*>(bytes.data());
    const double weight = q.back() / levels;
    for (size_t i = 0; i < c.params; ++i) values[i] = static_cast<float>((q[i] / levels * 2 - 1) / weight);
    Timed(seconds, [&] { Check(mean.Accept(plain, weight), "accept"); });
  }
  Timed(seconds, [&] { (void)Must(std::move(mean).Finish(), "finish"); });
  return seconds;
}

// Peak RSS (VmHWM) in MiB since the last ResetPeakRss.
double PeakRssMiB() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}
void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace
}  // namespace parsyn::bench

namespace parsyn::bench {
namespace {

struct Row {
  Case c;
  SecureRun secure;
  double plain_s = 0;
  double peak_rss_mib = 0;
  double Ratio() const { return (secure.coordinator_s + secure.slowest_worker_s) / plain_s; }
  double CoordinatorRatio() const { return secure.coordinator_s / plain_s; }
  double UploadRatio() const { return secure.upload_bytes / (4.0 * static_cast<double>(c.params)); }
};

Row Measure(const Case& c) {
  std::mt19937 rng(static_cast<unsigned>(c.params + c.workers));
  std::normal_distribution<float> normal(0.f, 0.05f);
  std::vector<float> update(c.params);
  for (float& v : update) v = normal(rng);
  Row row{c};
  ResetPeakRss();
  row.secure = RunSecure(c, update);
  row.peak_rss_mib = PeakRssMiB();
  row.plain_s = RunPlain(c, update, row.secure.survivors);
  std::printf("%4zu %6.1fM %4d %6zu %7.3f %8.3f %8.3f %7.2f %7.2f %9.3f %9.3f %8.0f\n", c.workers,
              static_cast<double>(c.params) / 1e6, c.bits, row.secure.coordinator_masks, row.plain_s,
              row.secure.coordinator_s, row.secure.slowest_worker_s, row.CoordinatorRatio(), row.Ratio(),
              row.UploadRatio(), row.secure.download_bytes / (4.0 * static_cast<double>(c.params)), row.peak_rss_mib);
  std::fflush(stdout);
  return row;
}

const char* Verdict(bool pass) { return pass ? "PASS" : "MISS"; }

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::printf(
      "bench_secagg: a secure round (10%% of workers drop before their masked input) against plain FedAvg of\n"
      "the same quantized updates; times in seconds; wall = coordinator + slowest worker (workers run in\n"
      "parallel); masks: the mask streams the coordinator expands; bytes per worker over the fp32 update's\n"
      "4 bytes per parameter\n");
  std::printf("%4s %7s %4s %6s %7s %8s %8s %7s %7s %9s %9s %8s\n", "K", "params", "bits", "masks", "plain", "coord",
              "worker", "coord/p", "wall/p", "up/fp32", "down/fp32", "peakMiB");
  std::vector<Row> rows;
  for (size_t params : quick ? std::vector<size_t>{1'000'000} : std::vector<size_t>{1'000'000, 20'000'000}) {
    for (size_t workers : {10u, 100u}) rows.push_back(Measure({workers, params, 16, 0.1}));
  }
  const Row eight = Measure({100, 1'000'000, 8, 0.1});
  const Row& largest = rows.back();
  std::printf("wall time, K=%zu, %.0fM parameters: %.2fx plain FedAvg (target <= 1.30) %s\n", largest.c.workers,
              static_cast<double>(largest.c.params) / 1e6, largest.Ratio(), Verdict(largest.Ratio() <= 1.3));
  std::printf("upload per worker at 16 bits: %.3fx fp32 (target <= 0.55) %s\n", largest.UploadRatio(),
              Verdict(largest.UploadRatio() <= 0.55));
  std::printf("upload per worker at 8 bits: %.3fx fp32 (target <= 0.30) %s\n", eight.UploadRatio(),
              Verdict(eight.UploadRatio() <= 0.30));
  const Row& ten = rows[rows.size() - 2];
  std::printf("peak RSS K=%zu over K=%zu at %.0fM parameters: %.2f (O(model): near 1)\n", largest.c.workers,
              ten.c.workers, static_cast<double>(largest.c.params) / 1e6, largest.peak_rss_mib / ten.peak_rss_mib);
  return 0;
}

}  // namespace
}  // namespace parsyn::bench

int main(int argc, char** argv) { return parsyn::bench::Main(argc, argv); }
