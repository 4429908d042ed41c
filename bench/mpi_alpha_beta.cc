// The link between two MPI ranks, measured with MPI alone (no strata): a
// ping-pong of an empty message gives the latency alpha (half the round trip),
// one of 64 MiB the bandwidth beta. comm_bench prices its transfers against
// alpha + n / beta. Run: mpirun -np 2 build/bench/mpi_alpha_beta
//
// With --allreduce MAX_MIB it times MPI_Allreduce instead (f32 sums over all
// ranks, 1 KiB to MAX_MIB MiB, the median of rank 0's times), the MPI
// library's own choice of algorithm beside which bench/run_comm.sh prints
// comm_bench's: mpirun -np 4 build/bench/mpi_alpha_beta --allreduce 256
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

// The median half round trip of `bytes` between ranks 0 and 1.
double half_round_trip(int rank, std::vector<char> &buffer, int bytes, int iterations) {
  std::vector<double> times;
  for (int i = 0; i < iterations + 2; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buffer.data(), bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buffer.data(), bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buffer.data(), bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buffer.data(), bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
    if (i >= 2) times.push_back((MPI_Wtime() - start) / 2); // the first two warm up
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// The median time of an in-place MPI_Allreduce of `bytes` of f32 on rank 0.
double allreduce_time(std::vector<float> &buffer, size_t bytes, int iterations) {
  std::vector<double> times;
  const int count = static_cast<int>(bytes / sizeof(float));
  for (int i = 0; i < iterations + 1; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, buffer.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (i >= 1) times.push_back(MPI_Wtime() - start); // the first one warms up
    std::fill(buffer.begin(), buffer.begin() + count, 1.0f); // keep the sums finite
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// A markdown table of MPI_Allreduce times, sizes as comm_bench's.
void allreduce_table(int rank, int size, size_t max_mib) {
  const size_t max_bytes = max_mib << 20;
  std::vector<float> buffer(max_bytes / sizeof(float), 1.0f);
  if (rank == 0)
    std::printf("MPI_Allreduce (MPI alone), %d ranks\n\n| size | MPI_Allreduce |\n|---:|---:|\n",
                size);
  for (size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    // Enough repetitions for ~0.2 s of traffic, at least 3 (as comm_bench).
    const int reps = static_cast<int>(std::clamp<size_t>((size_t{64} << 20) / bytes, 3, 200));
    const double t = allreduce_time(buffer, bytes, reps);
    if (rank != 0) continue;
    if (bytes >= (size_t{1} << 20))
      std::printf("| %zu MiB | %.1f us |\n", bytes >> 20, t * 1e6);
    else
      std::printf("| %zu KiB | %.1f us |\n", bytes >> 10, t * 1e6);
  }
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) {
    if (rank == 0) std::fprintf(stderr, "mpi_alpha_beta: run with mpirun -np 2 (or more)\n");
    MPI_Finalize();
    return 2;
  }
  if (argc == 3 && std::strcmp(argv[1], "--allreduce") == 0) {
    allreduce_table(rank, size, static_cast<size_t>(std::atol(argv[2])));
    MPI_Finalize();
    return 0;
  }
  const int big = 64 << 20;
  std::vector<char> buffer(big, 1);
  const double alpha = half_round_trip(rank, buffer, 0, 200);
  const double big_time = half_round_trip(rank, buffer, big, 10);
  const double beta = big / std::max(big_time - alpha, 1e-9);
  if (rank == 0) std::printf("alpha %.3e s  beta %.3e B/s\n", alpha, beta);
  MPI_Finalize();
  return 0;
}
