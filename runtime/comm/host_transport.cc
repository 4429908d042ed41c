#include "runtime/comm/host_transport.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <new>
#include <optional>
#include <thread>

namespace strata::runtime::host_transport {

std::string format_devices(const std::vector<int> &devices) {
  if (devices.size() == 1) return str_cat("device ", devices[0]);
  std::string out = "devices {";
  for (std::size_t i = 0; i < devices.size(); ++i)
    out += str_cat(i == 0 ? "" : ", ", devices[i]);
  return out + "}";
}

std::string collective_operation(const CollectiveSignature &signature,
                                 const std::vector<int> &members, std::string_view what) {
  const char *type = signature.type == ReduceType::kF32 ? "f32" : "f64";
  std::string operation;
  switch (signature.kind) {
  case CollectiveKind::kAllReduce:
    operation = str_cat("all_reduce of ", signature.count, " ", type);
    break;
  case CollectiveKind::kReduceScatter:
    operation = str_cat("reduce_scatter of ", signature.count, " ", type, " per device");
    break;
  case CollectiveKind::kAllGather:
    operation = str_cat("all_gather of ", signature.count, " bytes per device");
    break;
  case CollectiveKind::kBroadcast:
    operation = str_cat("broadcast of ", signature.count, " bytes from device ", signature.root);
    break;
  case CollectiveKind::kBarrier: operation = "barrier"; break;
  }
  return with_what(str_cat(operation, " over ", format_devices(members)), what);
}

std::string CollectiveCalls::check(const CollectiveSignature &signature, const Group &group) {
  members_ = group;
  for (int device = 0; group.empty() && device < devices_; ++device)
    members_.push_back(device);
  for (std::size_t i = 0; i < members_.size(); ++i) {
    if (members_[i] < 0 || members_[i] >= devices_ || (i > 0 && members_[i - 1] >= members_[i])) {
      return str_cat("a group lists distinct devices in increasing order, each in [0, ", devices_,
                     ")");
    }
  }
  const auto self = std::find(members_.begin(), members_.end(), device_);
  if (self == members_.end()) return str_cat("the group does not include device ", device_);
  position_ = static_cast<std::size_t>(self - members_.begin());
  if (signature.kind == CollectiveKind::kReduceScatter &&
      signature.input_count != signature.count * members_.size()) {
    return str_cat("the input has ", signature.input_count, " elements, not ", members_.size(),
                   " x ", signature.count);
  }
  if (signature.kind == CollectiveKind::kBroadcast &&
      !std::binary_search(members_.begin(), members_.end(), signature.root)) {
    return str_cat("the root, device ", signature.root, ", is not in the group");
  }
  return {};
}

void add_elements(ReduceType type, void *sum, const void *addend, std::size_t count) {
  auto add = [count](auto *out, const auto *in) {
    for (std::size_t i = 0; i < count; ++i)
      out[i] += in[i];
  };
  if (type == ReduceType::kF32) {
    add(static_cast<float *>(sum), static_cast<const float *>(addend));
  } else {
    add(static_cast<double *>(sum), static_cast<const double *>(addend));
  }
}

std::vector<std::byte> BufferPool::take(std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      std::vector<std::byte> buffer = std::move(it->second);
      free_.erase(it);
      held_ -= bytes;
      return buffer;
    }
  }
  return std::vector<std::byte>(bytes);
}

void BufferPool::give(std::vector<std::byte> buffer) {
  constexpr std::size_t kSmall = 4096, kMaxHeld = std::size_t{1} << 30, kPerSize = 8;
  if (buffer.size() < kSmall) return;
  std::lock_guard lock(mutex_);
  if (held_ + buffer.size() > kMaxHeld || free_.count(buffer.size()) >= kPerSize) return;
  held_ += buffer.size();
  free_.emplace(buffer.size(), std::move(buffer));
}

namespace {

std::mutex policy_mutex;
StuckDevicePolicy stuck_policy;

// The device threads' progress, as the joining thread sees it.
struct Progress {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<bool> done;
  std::optional<std::chrono::steady_clock::time_point> failed_at;
  Status failure;
};

// Waits until every thread is done; with a policy's `end`, ends the process
// once the world has failed and some device has not stopped within `grace`.
void wait_for_devices(Progress &progress, const std::vector<int> &devices) {
  StuckDevicePolicy policy;
  {
    std::lock_guard lock(policy_mutex);
    policy = stuck_policy;
  }
  std::unique_lock lock(progress.mutex);
  auto all_done = [&] {
    return std::all_of(progress.done.begin(), progress.done.end(), [](bool d) { return d; });
  };
  while (!all_done()) {
    if (!policy.end || !progress.failed_at) {
      progress.changed.wait_for(lock, std::chrono::milliseconds(100));
      continue;
    }
    const auto deadline = *progress.failed_at + policy.grace;
    if (progress.changed.wait_until(lock, deadline, all_done)) break;
    std::vector<int> stuck;
    for (std::size_t i = 0; i < devices.size(); ++i)
      if (!progress.done[i]) stuck.push_back(devices[i]);
    policy.end(Status(progress.failure.code(),
                      str_cat(format_devices(stuck), " did not stop within ",
                              format_duration(policy.grace),
                              " of the failure (stalled): ", progress.failure.message())));
  }
}

} // namespace

void set_stuck_device_policy(StuckDevicePolicy policy) {
  std::lock_guard lock(policy_mutex);
  stuck_policy = std::move(policy);
}

void run_device_threads(const std::vector<int> &devices,
                        const std::function<Status(int device)> &body,
                        const std::function<void(int device, const Status &error)> &fail) {
  Progress progress;
  progress.done.assign(devices.size(), false);
  std::vector<std::thread> threads;
  threads.reserve(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    threads.emplace_back([&, i] {
      const int device = devices[i];
      Status status;
      try {
        status = body(device);
      } catch (const std::bad_alloc &error) {
        status = resource_exhausted(
            "out of memory: this host cannot allocate what the device needs (", error.what(), ")");
      } catch (const std::exception &error) {
        status = internal_error("threw an exception: ", error.what());
      } catch (...) {
        status = internal_error("threw an exception");
      }
      if (!status.is_ok()) fail(device, status);
      std::lock_guard lock(progress.mutex);
      progress.done[i] = true;
      if (!status.is_ok() && !progress.failed_at) {
        progress.failed_at = std::chrono::steady_clock::now();
        progress.failure = status;
      }
      progress.changed.notify_all();
    });
  }
  wait_for_devices(progress, devices);
  for (std::thread &thread : threads)
    thread.join();
}

} // namespace strata::runtime::host_transport
