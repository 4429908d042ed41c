// The link between two MPI ranks, measured with MPI alone (no strata): a
// ping-pong of an empty message gives the latency alpha (half the round trip),
// one of 64 MiB the bandwidth beta. comm_bench prices its transfers against
// alpha + n / beta. Run: mpirun -np 2 build/bench/mpi_alpha_beta
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
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
  const int big = 64 << 20;
  std::vector<char> buffer(big, 1);
  const double alpha = half_round_trip(rank, buffer, 0, 200);
  const double big_time = half_round_trip(rank, buffer, big, 10);
  const double beta = big / std::max(big_time - alpha, 1e-9);
  if (rank == 0) std::printf("alpha %.3e s  beta %.3e B/s\n", alpha, beta);
  MPI_Finalize();
  return 0;
}
