// MpiWorld: the devices of a plan spread over the ranks of an MPI job.
//
// Open MPI (or any MPI) launches the processes (`mpirun -np N strata run ...`,
// or `srun` under Slurm) and carries their messages; strata adds the
// plan's view on top: rank r runs devices [r k, (r + 1) k) for k devices per
// rank, each on its own thread with a Communicator.
//
// Transport. One progress thread per process makes every MPI call after
// MPI_Init (MPI_THREAD_SERIALIZED is all it needs), so device threads never
// block inside MPI and every wait they make is a condition-variable wait
// bounded by the timeout. A message between devices of different ranks is a
// small header (source and destination device, the 64-bit plan tag, the byte
// count, a sequence number) on a control communicator, then the payload on a
// data communicator with MPI tag = the sequence number. The receiver matches
// headers to posted receives by (source device, tag) in posting order, the
// Communicator contract. The payload lands in a staging buffer and is copied
// to the device's buffer only if the device still waits for it (after a
// failure its arena may be gone while MPI still delivers). Messages between
// devices of the same rank never touch MPI. Collectives are built from these
// point-to-point messages (gather to the group's first member, sum in device
// order, send back), so their results are bitwise those of the threaded run;
// the plan's algorithms (ring, tree, recursive doubling, Rabenseifner:
// runtime/comm/collectives.h) run over them the same way.
//
// Start and end. MPI_Init and MPI_Finalize wait for every rank, so each runs
// under a watchdog bounded by the timeout: a rank that never starts makes the
// others stop with an error saying so. Open MPI's single-copy shared-memory
// transfers are turned off (btl_vader_single_copy_mechanism=none, unless the
// environment sets it): a receiver reading a dead peer's memory would crash
// before it could report.
//
// Failure. Every rank sends a heartbeat with where each of its devices is
// (step, instruction) every `heartbeat` (sooner when a device moves on, at
// once on a new step). The first failure on any rank (a timeout, an error, an
// abort) is sent to every other rank, which fails with it at once; a rank
// nobody has heard from for the timeout (stopped, hung, partitioned) is
// declared lost, with the step and instruction it last reported, and a
// receive that times out names a silent rank first. When one rank dies
// (SIGKILL, a crash, an exit), the launcher sends SIGTERM to the others and
// SIGKILL a second later: each asks the others whether they are alive (a few
// hundred milliseconds), names the ranks that do not answer as lost (with
// where they last were) and exits non-zero. A rank on the same host and pid
// namespace is asked of the kernel as well, and counts as alive while its
// process exists: after a peer was killed, a survivor has been seen (rarely)
// to receive nothing more from anyone, answers included.
//
// The failure tests inject faults through STRATA_FAULT (read in
// tools/cmd_run_train.cc): a device that errs, stalls, is killed, exits or
// stops at an instruction, a rank that never starts, a kill while a
// checkpoint is written.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/device_world.h"
#include "runtime/comm/local_communicator.h"

namespace strata::runtime {

// Whether this build has MPI.
bool mpi_built();

// The rank and size an MPI launcher gave this process, from its environment
// (Open MPI's OMPI_COMM_WORLD_*, PMIx's PMIX_RANK, Slurm's PMI_*); none when
// the process was started without a launcher.
struct MpiLaunch {
  int rank = 0;
  int size = 1;
  // This rank's index among the ranks on its node (the GPU a CUDA rank
  // takes), from OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or
  // MPI_LOCALRANKID; 0 when the launcher does not say.
  int local_rank = 0;
};
std::optional<MpiLaunch> detect_mpi_launch();

// One report per failed process: true for the first caller (who then prints
// the error), false afterwards. The launcher's SIGTERM and the main thread
// both report failures; this keeps it to one message.
bool claim_failure_report();

struct MpiWorldOptions {
  int devices_per_rank = 1;
  std::chrono::milliseconds timeout = kDefaultCommunicatorTimeout;
  std::chrono::milliseconds heartbeat{100};
  // Bytes each device shares with the devices of the other ranks on its host
  // (an MPI-3 shared-memory window, made at start-up): its gradient buckets
  // are packed there, and the members of a group on one host sum straight
  // from each other's (Communicator::shared_segment). 0: none.
  size_t shared_bytes = 0;
  // Per device of the plan (empty: none), the bytes of its memory (arena,
  // held tensors, staging) to place in the same window, so that the members
  // of a group on one host read each other's buffers in place, as threads
  // do (Communicator::shares_memory). Made only when every host's memory
  // file system (Open MPI's osc_sm_backing_directory: /dev/shm unless the
  // environment names another) has room for the devices on that host;
  // DeviceWorld::shared_memory says whether.
  std::vector<size_t> memory_bytes;
};

class MpiWorld : public DeviceWorld, public ProcessGroup {
public:
  // Joins the MPI job (MPI_Init, bounded by the timeout) for a plan of
  // `num_devices` devices; the job must have num_devices / devices_per_rank
  // ranks. One per process.
  static Result<std::shared_ptr<MpiWorld>> create(int num_devices, const MpiWorldOptions &options);
  ~MpiWorld() override;

  // DeviceWorld.
  int num_devices() const override;
  bool is_local(int device) const override;
  std::chrono::milliseconds timeout() const override;
  Status run(const std::function<Status(int device, Communicator &)> &body) override;
  // The second communicator of a device is a second channel of the same
  // ranks: its collectives are tagged apart from the first's.
  Status run_with_side(
      const std::function<Status(int device, Communicator &, Communicator *)> &body) override;
  void report(int device, int64_t step, int64_t instruction) override;
  ProcessGroup *processes() override { return this; }
  // Valid until finish().
  std::span<std::byte> shared_memory(int device) const override;

  // ProcessGroup.
  int rank() const override;
  int size() const override;
  Status gather(const std::string &mine, std::vector<std::string> *all,
                std::string_view what) override;
  Status broadcast(std::string *data, std::string_view what) override;

  // Describes instruction `instruction` of `device` in failure reports.
  void set_describer(std::function<std::string(int device, int64_t instruction)> describe) override;
  // Names this process's devices in errors ("device 2 (stage 1)").
  void set_label(int device, std::string label);

  // The start-up agreement, before anything else: every rank sends its strata
  // version, plan fingerprint (and file name), world size, layout and the
  // run's `settings` (name, value: seed, steps, data, checkpoint folder, ...)
  // to rank 0, which checks them and tells every rank the verdict. An error
  // names the ranks on each side of every difference.
  Status agree(const std::string &fingerprint, const std::string &plan,
               const std::vector<std::pair<std::string, std::string>> &settings = {});

  // Ends the world from this process; the other ranks fail with `reason`.
  void fail(const Status &reason);
  Status failure() const;

  // Leaves the job. After success: waits for every rank (bounded), then
  // MPI_Finalize. After a failure (`failed`): gives the failure report a moment
  // to reach the other ranks, then ends this process with exit status 1
  // without finalizing, so the launcher ends the rest of the job; it does not
  // return.
  void finish(bool failed);

  class Impl;

private:
  explicit MpiWorld(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace strata::runtime
