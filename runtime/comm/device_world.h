// DeviceWorld: where the devices of a run live and how they reach each other.
//
// A runner asks its world which devices are local to this process, and runs one
// body per local device, each on its own thread with that device's
// Communicator. Two worlds exist: LocalDeviceWorld (every device a thread of
// this process, runtime/comm/local_communicator.h) and MpiWorld (the devices spread
// over the ranks of an MPI job, runtime/comm/mpi_world.h). A runner written against
// this interface runs the same plan unchanged in one process or in many.
//
// ProcessGroup: what the processes of a multi-process run say to each other
// outside the plan (start-up agreement, checkpoint commits). Every call is
// collective over all processes and bounded by the world's timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/comm/communicator.h"

namespace strata::runtime {

class ProcessGroup {
public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0; // this process, 0 .. size() - 1
  virtual int size() const = 0;
  // Rank 0 receives every rank's `mine` in rank order (others get nothing).
  virtual Status gather(const std::string &mine, std::vector<std::string> *all,
                        std::string_view what) = 0;
  // Every rank receives rank 0's `data`.
  virtual Status broadcast(std::string *data, std::string_view what) = 0;
};

class DeviceWorld {
public:
  virtual ~DeviceWorld() = default;
  virtual int num_devices() const = 0;
  virtual bool is_local(int device) const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  // Runs `body` for every local device, each on its own thread, and joins them.
  // Returns the world's first failure (naming its device) or ok. After a
  // failure the world is spent: later runs fail at once.
  virtual Status run(const std::function<Status(int device, Communicator &)> &body) = 0;
  // The same, with a second communicator per device over an independent world
  // (its own messages and collectives), for a device's communication stream;
  // null where the world has none (then the body uses the first). A failure in
  // either world must be reported through the first.
  virtual Status
  run_with_side(const std::function<Status(int device, Communicator &, Communicator *)> &body) {
    return run([&](int device, Communicator &comm) { return body(device, comm, nullptr); });
  }
  // Where a device is (step, instruction index; -1 between instructions), for
  // the failure reports of other processes. Cheap; called per instruction.
  virtual void report(int device, int64_t step, int64_t instruction) {}
  // How failure reports describe instruction `instruction` of `device`.
  virtual void set_describer(std::function<std::string(int device, int64_t instruction)>) {}
  // The processes of the run; null for a single-process world.
  virtual ProcessGroup *processes() { return nullptr; }
  // Where local device `device` keeps its memory so that the other
  // processes on its host can read it in place, or empty: allocate it
  // anywhere. A device given one must place every buffer its collectives
  // touch in it: the other processes cannot reach any other
  // (Communicator::shared_address).
  virtual std::span<std::byte> shared_memory(int device) const {
    (void)device;
    return {};
  }
};

// Every device is a thread of this process; each run() uses a fresh LocalWorld.
class LocalDeviceWorld : public DeviceWorld {
public:
  LocalDeviceWorld(int devices, std::chrono::milliseconds timeout)
      : devices_(devices), timeout_(timeout) {}
  int num_devices() const override { return devices_; }
  bool is_local(int) const override { return true; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  Status run(const std::function<Status(int device, Communicator &)> &body) override;
  Status run_with_side(
      const std::function<Status(int device, Communicator &, Communicator *)> &body) override;

private:
  int devices_;
  std::chrono::milliseconds timeout_;
};

} // namespace strata::runtime
