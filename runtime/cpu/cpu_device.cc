#include "runtime/cpu/cpu_device.h"

#include <cstring>

namespace strata::runtime {

using serialization::InstrKind;

Status CpuDevice::check_kernels(const core::PipelinePlan &plan,
                                const core::DeviceProgram &program) {
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const core::Op &op = program.ops[i];
    if (op.kind != InstrKind::kCompute && op.kind != InstrKind::kComputeShard) continue;
    if (op.collective == ops::Collective::kNone && op.def->cpu_kernel == nullptr)
      return unimplemented(plan.context(program.device, i), ": op ", op.node->op,
                           " has no CPU kernel");
  }
  return Status::ok();
}

Status CpuDevice::run_node(size_t instruction) {
  const core::Op &op = program_.ops[instruction];
  ops::KernelContext context{*op.node, *op.def, op.inputs, op.outputs, op.parts, op.member};
  return op.def->cpu_kernel(context);
}

Status CpuDevice::copy(void *to, const void *from, size_t bytes) {
  if (bytes > 0 && to != from) std::memcpy(to, from, bytes);
  return Status::ok();
}

Status CpuDevice::copy_rows(void *to, size_t to_pitch, const void *from, size_t from_pitch,
                            size_t width, size_t rows) {
  if (width == 0) return Status::ok();
  for (size_t row = 0; row < rows; ++row)
    std::memcpy(static_cast<std::byte *>(to) + row * to_pitch,
                static_cast<const std::byte *>(from) + row * from_pitch, width);
  return Status::ok();
}

Status CpuDevice::accumulate(float *sum, const float *add, size_t count) {
  for (size_t e = 0; e < count; ++e)
    sum[e] += add[e];
  return Status::ok();
}

Status CpuDevice::divide(float *data, float divisor, size_t count) {
  for (size_t e = 0; e < count; ++e)
    data[e] /= divisor;
  return Status::ok();
}

Status CpuDevice::update(size_t instruction) {
  const core::Op &op = program_.ops[instruction];
  if (op.bytes > 0 && op.data != op.source) std::memmove(op.data, op.source, op.bytes);
  return Status::ok();
}

} // namespace strata::runtime
