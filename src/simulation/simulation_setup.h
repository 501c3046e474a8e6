// `parsyn simulate`'s set-up (simulation.h): the options checked, and the output folder's stores with the dataset, the
// model, the virtual workers and the job recorded as the API would have recorded them (the same checks).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "coordinator/job_spec.h"
#include "simulation/simulation.h"
#include "storage/directory_blob_store.h"
#include "storage/metadata_store.h"
#include "storage/sqlite_store.h"

namespace parsyn::simulation {

// The flags' own rules (--workers, --parallel, --threads, --speeds, --dropout, --data, --job): InvalidArgument.
Status CheckOptions(const SimulationOptions& options);

// The seed --speeds lognormal draws from: the job's config.seed (its default when not given).
uint64_t SpeedSeed(const nlohmann::json& job);

// What RunSimulation runs: the output folder's stores with the dataset, the model, the virtual workers and the job
// recorded, as the API would have recorded them.
struct Prepared {
  std::unique_ptr<storage::SqliteMetadataStore> store;
  std::unique_ptr<storage::DirectoryBlobStore> blobs;
  std::vector<int64_t> worker_ids;
  std::vector<std::string> warnings;
  coordinator::JobSpec spec;
  storage::TrainingJob job;
};
// Records them; InvalidArgument naming the flag or field for bad input. Blocking.
StatusOr<Prepared> Prepare(const SimulationOptions& options);

}  // namespace parsyn::simulation
