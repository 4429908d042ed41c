// What every build knows about MPI launches, with or without MPI itself.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>

#include "runtime/comm/mpi_world.h"

namespace strata::runtime {
namespace {

int env_int(const char *name, int fallback) {
  const char *value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char *end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > INT_MAX) return fallback;
  return static_cast<int>(parsed);
}

std::atomic<bool> g_reported{false};

} // namespace

std::optional<MpiLaunch> detect_mpi_launch() {
  const std::pair<const char *, const char *> vars[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"PMIX_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"PMI_RANK", "PMI_SIZE"},
  };
  for (const auto &[rank_var, size_var] : vars) {
    int rank = env_int(rank_var, -1), size = env_int(size_var, -1);
    if (rank >= 0 && size >= 1 && rank < size) {
      int local = -1;
      for (const char *var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
        if (local < 0) local = env_int(var, -1);
      return MpiLaunch{rank, size, std::max(local, 0)};
    }
  }
  return std::nullopt;
}

bool claim_failure_report() { return !g_reported.exchange(true); }

} // namespace strata::runtime
