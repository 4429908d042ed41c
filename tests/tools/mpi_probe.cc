// Run by the mpi suite under `mpirun -np N`: joins the job with one device per
// rank, shares a unique id from rank 0 the way NCCL communicators are
// bootstrapped, and prints what this rank received. With a real NCCL id where
// the machine allows one (a GPU driver), otherwise with bytes rank 0 draws.
#include <cstdio>
#include <random>

#include "runtime/comm/mpi_world.h"
#include "runtime/cuda/nccl_bootstrap.h"

int main() {
  using namespace strata;
  using namespace strata::runtime;
  auto launch = detect_mpi_launch();
  if (!launch) {
    std::fprintf(stderr, "mpi_probe: start me with mpirun\n");
    return 2;
  }
  MpiWorldOptions options;
  options.timeout = std::chrono::milliseconds(20'000);
  auto world = MpiWorld::create(launch->size, options);
  if (!world.is_ok()) {
    std::fprintf(stderr, "mpi_probe: %s\n", world.status().message().c_str());
    return 1;
  }
  std::string source = "drawn";
  auto id = share_unique_id(**world, [&]() -> Result<std::string> {
    auto real = nccl_unique_id();
    if (real.is_ok()) {
      source = "nccl";
      return real;
    }
    std::random_device device;
    std::string bytes(128, '\0');
    for (char &c : bytes)
      c = static_cast<char>(device());
    return bytes;
  });
  if (!id.is_ok()) {
    std::fprintf(stderr, "mpi_probe: %s\n", id.status().message().c_str());
    (*world)->finish(true);
  }
  std::string hex;
  for (unsigned char c : *id) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02x", c);
    hex += buf;
  }
  std::printf("rank %d of %d: id %s (%zu bytes)\n", (*world)->rank(), (*world)->size(), hex.c_str(),
              id->size());
  // Each rank makes its communicator from the id: on a GPU machine it works;
  // without one every rank must fail promptly with NCCL's reason.
  if (!(*world)->broadcast(&source, "id source").is_ok()) (*world)->finish(true);
  if (source == "nccl") {
    auto comm =
        nccl_init_rank(*id, (*world)->size(), (*world)->rank(), std::chrono::milliseconds(10'000));
    std::printf("rank %d nccl init: %s\n", (*world)->rank(),
                comm.is_ok() ? "ok" : comm.status().message().c_str());
  }
  std::fflush(stdout);
  (*world)->finish(false);
  return 0;
}
