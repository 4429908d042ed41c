// PipelinePlan: a pipeline plan as every backend executes it, read and
// checked once.
//
// A pipeline plan (plan.pipeline set) gives every device a program of
// instructions over buffers keyed by (tensor, micro-batch). What the plan
// leaves implicit is decided here, once for the CPU and the CUDA runners:
//  - where a device sits in the mesh: device (stage * DP + replica) * TP +
//    member; replica r of a stage runs micro-batches r M .. r M + M - 1 of the
//    step's batch (rows [(r M + k) b, (r M + k + 1) b) of dim 0);
//  - which group each collective runs over, and with which algorithm;
//  - what a device holds of each parameter and state tensor (`Held`): all of
//    it, its tensor-parallel member's piece (PlanShard: the plan's graph
//    declares the piece), and with ZeRO-1 only its shard of that (elements
//    [r n / D, (r + 1) n / D) of the group's D devices, flat); with ZeRO-2
//    also which gradients' step buffers are such shards; with ZeRO-3 the
//    parameters too, which GatherParam fills whole into per-block buffers
//    (the forward or backward of a micro-batch) before their readers;
//  - how those parts make the whole tensor again (value(), checkpoints) and
//    how a whole value is cut into them (assign(), resume);
//  - the names checkpoint pieces get over several processes:
//    "<name>@tp<m>of<T>" for a member's piece, "<name>@shard<i>of<n>" for a
//    ZeRO-1 shard (of the piece, or of the whole tensor).
//
// A backend keeps each device's parts in its own memory and answers two
// questions: read the part device d holds of a tensor, write it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "graph/host_tensor.h"
#include "runtime/comm/collectives.h"
#include "serialization/plan_io.h"

namespace strata::runtime::core {

class PipelinePlan {
public:
  // Checks what every backend relies on before it allocates anything: the
  // graph (verify_graph), inputs that a step can cut into micro-batches,
  // programs in device order whose receives and collectives all complete
  // (plan::check_deadlock), groups that name the plan's devices, tensor-
  // parallel shards of known tensors, ZeRO-1 shard groups the device is in;
  // then what the programs mean (plan::verify_plan). Errors carry `context`.
  static Result<std::unique_ptr<const PipelinePlan>> create(const serialization::Plan &plan,
                                                            std::string_view context);

  const Graph &graph() const { return graph_; }
  const serialization::PlanPipeline &pipeline() const { return pipeline_; }
  const std::vector<serialization::PlanProgram> &programs() const { return programs_; }
  const serialization::PlanProgram &program(int device) const {
    return programs_[static_cast<size_t>(device)];
  }
  int num_devices() const { return static_cast<int>(programs_.size()); }
  int microbatches() const { return pipeline_.microbatches; }
  int data_parallel() const { return pipeline_.data_parallel; }
  int tensor_parallel() const { return pipeline_.tensor_parallel; }
  // Micro-batch slices a step's batch is cut into: microbatches x replicas.
  int64_t slices() const { return int64_t{microbatches()} * data_parallel(); }

  // The device's replica and its place in its tensor-parallel group.
  int replica(int device) const { return device / tensor_parallel() % data_parallel(); }
  int member(int device) const { return device % tensor_parallel(); }
  // Which slice of the batch micro-batch `microbatch` of `device` reads.
  int64_t slice(int device, int32_t microbatch) const {
    return int64_t{replica(device)} * microbatches() + microbatch;
  }

  const std::vector<int32_t> &group(int index) const {
    return pipeline_.groups[static_cast<size_t>(index)];
  }
  int num_groups() const { return static_cast<int>(pipeline_.groups.size()); }
  // The group the tensor-parallel collectives of `device` run over.
  int tp_group(int device) const { return pipeline_.tp_groups_begin + device / tensor_parallel(); }
  // The position of `device` in group `index`.
  size_t position(int index, int device) const;
  // The algorithm the plan chose for a group's collectives: ring, tree,
  // recursive doubling, Rabenseifner, or none (the transport's own).
  std::optional<CollectiveAlgo> algorithm(int index) const;

  // The graph input `id` is (its index in graph().inputs()), or -1.
  int64_t input_index(TensorId id) const { return input_index_[id]; }
  // The batch a step consumes: the graph's input types with dim 0 times the
  // slices, and the check of a step's inputs against them.
  std::vector<TensorType> batch_types() const;
  Status check_batch(llvm::ArrayRef<HostTensor> inputs) const;

  // The device whose step buffer of graph output k is read after a step:
  // the first keeping one.
  int output_device(size_t k) const { return output_device_[k]; }

  // "device 2 instruction 7 (recv 'h' mb 1 from device 1)".
  std::string context(int device, size_t instruction) const;

  // ZeRO-1: the shard group of a device (-1: none), its position there and
  // the group's size, and the tensors it holds as its shard.
  struct Shards {
    int group = -1;
    int rank = 0, count = 1;
    std::set<TensorId> tensors;
  };
  const Shards &shards(int device) const { return shards_[static_cast<size_t>(device)]; }
  // ZeRO-2: whether `device` keeps only its shard of tensor `id`'s step
  // buffer (id, -1): it reduce-scatters `id` into it every micro-batch. The
  // shard is elements [r n / D, (r + 1) n / D) for its position r among the
  // stage's D = data_parallel() replicas (serialization::slot_bytes).
  bool shard_accumulated(int device, TensorId id) const {
    return shard_sums_[static_cast<size_t>(device)][id];
  }
  // ZeRO-3: whether `device` gathers parameter `id` (GatherParam) into a
  // buffer per block before the nodes that read it (it holds only its shard:
  // shards()); per-micro-batch nodes then read buffer (id, block), block =
  // plan::gather_block(backward(node), micro-batch, M).
  bool gathers(int device, TensorId id) const {
    return gathered_[static_cast<size_t>(device)][id];
  }
  // Whether node `id` is backward work (known where some device gathers).
  bool backward(NodeId id) const { return id < backward_.size() && backward_[id]; }

  // Tensors every tensor-parallel member holds a piece of (null: whole).
  const serialization::PlanShard *tp_shard(TensorId id) const;
  // The whole tensor's type (a piece's full shape).
  TensorType value_type(TensorId id) const;

  // What device `device` holds of tensor `id`: the part's identity (the same
  // bytes on every device with the same key) and its type in the device's
  // memory (a ZeRO-1 shard flat).
  struct Held {
    TensorId id = 0;
    int member = 0; // the tensor-parallel piece (0 outside tensor parallelism)
    int shard = -1; // the ZeRO-1 shard of it, or -1
    TensorType type;
    auto key() const { return std::tuple<TensorId, int, int>{id, member, shard}; }
  };
  Held held(int device, TensorId id) const;
  bool holds(int device, TensorId id) const;
  // The part's value at the start: its tensor materialized (inline data,
  // external data in `model_dir`, or its initializer), cut to the part.
  Result<HostTensor> materialize(const Held &held, const std::string &model_dir) const;

  // Whether this process runs `device` (and so can read its parts).
  using Local = std::function<bool(int device)>;
  // Reads the part a local device holds of `id` (of held().type); nullopt
  // where it cannot be read.
  using ReadPart = std::function<std::optional<HostTensor>(int device, TensorId id)>;
  // The whole tensor from the first local device holding it: its shards
  // joined over its shard group (a shard of another process stays zero)
  // and, in pieces, its group's members' pieces joined (nullopt unless all
  // are local). nullopt where no local device holds it.
  std::optional<HostTensor> whole_value(TensorId id, const Local &local,
                                        const ReadPart &read) const;
  // Cuts a whole `value` (of value_type(id)) into every holder's part and
  // hands each to `write`.
  using WritePart = std::function<Status(int device, const std::byte *data, size_t bytes)>;
  Status split_value(TensorId id, const HostTensor &value, const WritePart &write) const;
  // What a process writes to a checkpoint: every parameter and state tensor
  // whole where its first holder keeps it whole, else as named pieces and
  // shards (see above); only the parts `read` can read here.
  std::map<std::string, HostTensor> checkpoint_pieces(const Local &local,
                                                      const ReadPart &read) const;

private:
  PipelinePlan() = default;
  Status index();
  // The device's whole copy of `id` (its piece under tensor parallelism),
  // its ZeRO-1 shard group's shards joined.
  std::optional<HostTensor> device_whole(int device, TensorId id, const Local &local,
                                         const ReadPart &read) const;
  int first_holder(TensorId id) const;

  Graph graph_;
  serialization::PlanPipeline pipeline_;
  std::vector<serialization::PlanProgram> programs_;
  std::vector<int64_t> input_index_;
  std::vector<int> output_device_;
  std::vector<Shards> shards_;
  std::vector<std::vector<bool>> held_;       // per device, per tensor: in its holds
  std::vector<std::vector<bool>> shard_sums_; // per device, per tensor: ZeRO-2's
  std::vector<std::vector<bool>> gathered_;   // per device, per tensor: ZeRO-3's
  std::vector<bool> backward_;                // by node, where some device gathers
  std::map<TensorId, serialization::PlanShard> tp_shards_;
};

} // namespace strata::runtime::core
