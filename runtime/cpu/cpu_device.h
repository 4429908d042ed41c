// The CPU backend of the execution core: a plan device whose memory is host
// memory and whose nodes run the registry's CPU kernels, on the thread that
// issues them.
#pragma once

#include "runtime/core/issue.h"

namespace strata::runtime {

class CpuDevice : public core::DeviceBackend {
public:
  explicit CpuDevice(core::DeviceProgram &program) : program_(program) {}
  // Every node the program computes has a CPU kernel (or runs over its
  // group); else an error naming the device's instruction.
  static Status check_kernels(const core::PipelinePlan &plan, const core::DeviceProgram &program);

  Status run_node(size_t instruction) override;
  Status copy(void *to, const void *from, size_t bytes) override;
  Status copy_rows(void *to, size_t to_pitch, const void *from, size_t from_pitch, size_t width,
                   size_t rows) override;
  Status accumulate(float *sum, const float *add, size_t count) override;
  Status divide(float *data, float divisor, size_t count) override;
  Status update(size_t instruction) override;

private:
  core::DeviceProgram &program_;
};

} // namespace strata::runtime
