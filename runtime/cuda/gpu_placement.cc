#include "runtime/cuda/gpu_placement.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "ops/registry.h"
#include "plan/instructions.h"

namespace strata::runtime {

const char *gpu_transport_name(GpuTransport transport) {
  return transport == GpuTransport::kNccl ? "nccl" : "device copies";
}

GpuTransport GpuPlacement::link(int a, int b) const {
  return gpu_of_device[static_cast<size_t>(a)] == gpu_of_device[static_cast<size_t>(b)]
             ? GpuTransport::kDeviceCopy
             : GpuTransport::kNccl;
}

Result<GpuPlacement> place_on_gpus(int devices, const std::vector<std::vector<int32_t>> &groups,
                                   int gpus, const std::vector<int> &gpu_list) {
  if (devices < 1) return invalid_argument("the plan has no devices to place on GPUs");
  if (gpus < 1)
    return failed_precondition("no CUDA GPU is visible to place the plan's ", devices,
                               " device(s) on (CUDA_VISIBLE_DEVICES, driver)");
  GpuPlacement placement;
  if (gpu_list.empty()) {
    for (int d = 0; d < devices; ++d)
      placement.gpu_of_device.push_back(d % gpus);
  } else {
    if (static_cast<int>(gpu_list.size()) != devices)
      return invalid_argument("--gpus lists ", gpu_list.size(), " GPU(s); the plan has ", devices,
                              " devices and needs one GPU index per device");
    for (size_t d = 0; d < gpu_list.size(); ++d)
      if (gpu_list[d] < 0 || gpu_list[d] >= gpus)
        return invalid_argument("--gpus: plan device ", d, " is given GPU ", gpu_list[d],
                                ", but this machine shows ", gpus, " GPU(s) (0 to ", gpus - 1, ")");
    placement.gpu_of_device = gpu_list;
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<int32_t> seen_on(static_cast<size_t>(gpus), -1);
    GpuTransport transport = GpuTransport::kNccl;
    std::string why = "every member on its own GPU";
    for (int32_t device : groups[g]) {
      if (device < 0 || device >= devices)
        return invalid_argument("group ", g, " names device ", device, "; the plan has ", devices);
      const int gpu = placement.gpu_of_device[static_cast<size_t>(device)];
      int32_t &first = seen_on[static_cast<size_t>(gpu)];
      if (first >= 0 && transport == GpuTransport::kNccl) {
        transport = GpuTransport::kDeviceCopy;
        why = str_cat("devices ", first, " and ", device, " share GPU ", gpu,
                      ", and NCCL refuses two ranks of a communicator on one GPU");
      }
      if (first < 0) first = device;
    }
    placement.group_transport.push_back(transport);
    placement.group_why.push_back(std::move(why));
  }
  return placement;
}

Result<std::vector<int>> parse_gpu_list(std::string_view text) {
  std::vector<int> out;
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    const std::string_view entry =
        text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
    int value = -1;
    const auto [end, error] = std::from_chars(entry.data(), entry.data() + entry.size(), value);
    if (entry.empty() || error != std::errc() || end != entry.data() + entry.size() || value < 0)
      return invalid_argument("--gpus '", text, "': entry ", out.size(), " ('", entry,
                              "') is not a GPU index (expected e.g. 0,0,1,1)");
    out.push_back(value);
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

Result<std::vector<GpuLaunch>>
gpu_launch_order(const Graph &graph, const std::vector<serialization::PlanProgram> &programs,
                 const std::vector<std::vector<int32_t>> &groups, int tensor_parallel,
                 int tp_groups_begin) {
  using serialization::InstrKind;
  using serialization::PlanInstruction;
  const size_t devices = programs.size();
  auto collective = [](InstrKind kind) {
    return kind == InstrKind::kAllReduce || kind == InstrKind::kReduceScatter ||
           kind == InstrKind::kAllGather || kind == InstrKind::kStartBucket ||
           kind == InstrKind::kReduceScatterAccumulate || kind == InstrKind::kGatherParam;
  };
  // Buckets whose reduction has been launched, per (device, its bucket index).
  std::set<std::pair<int, uint32_t>> reduced;
  auto describe = [&](size_t d, size_t i) {
    return str_cat("device ", d, " instruction ", i, " (",
                   plan::describe_instruction(graph, programs[d].instructions[i]), ")");
  };
  std::vector<size_t> next(devices, 0);
  // Sends enqueued and not yet received, per (from, to, tag), in order.
  std::map<std::tuple<int, int, uint64_t>, size_t> unreceived;
  // A tensor-parallel node that communicates: its group, else -1.
  auto tp_group = [&](size_t d, const PlanInstruction &instr) -> int32_t {
    if (tensor_parallel <= 1 || instr.kind != InstrKind::kCompute ||
        instr.index >= graph.num_nodes())
      return -1;
    if (!ops::communicates_forward(ops::collective_of(graph.node(instr.index).op))) return -1;
    return tp_groups_begin + static_cast<int32_t>(d) / tensor_parallel;
  };
  // Members that reached a collective, per (kind, group, index, micro-batch).
  std::map<std::tuple<InstrKind, int32_t, uint32_t, int32_t>, std::vector<GpuLaunch::Part>> arrived;
  std::vector<bool> waiting(devices, false); // at a collective, counted in `arrived`
  std::vector<GpuLaunch> order;
  size_t left = 0;
  for (const auto &program : programs)
    left += program.instructions.size();
  while (left > 0) {
    bool progress = false;
    for (size_t d = 0; d < devices; ++d) {
      const auto &instructions = programs[d].instructions;
      while (next[d] < instructions.size() && !waiting[d]) {
        const size_t i = next[d];
        const PlanInstruction &instr = instructions[i];
        const GpuLaunch::Part part{static_cast<int>(d), static_cast<uint32_t>(i)};
        if (instr.kind == InstrKind::kRecv) {
          auto it = unreceived.find({instr.peer, static_cast<int>(d),
                                     plan::transfer_tag(instr.index, instr.microbatch)});
          if (it == unreceived.end() || it->second == 0) break;
          --it->second;
        } else if (instr.kind == InstrKind::kSend) {
          ++unreceived[{static_cast<int>(d), instr.peer,
                        plan::transfer_tag(instr.index, instr.microbatch)}];
        } else if (instr.kind == InstrKind::kWaitBucket) {
          if (!reduced.contains({static_cast<int>(d), instr.index})) break;
        } else if (collective(instr.kind) || tp_group(d, instr) >= 0) {
          const int32_t group_id = collective(instr.kind) ? instr.peer : tp_group(d, instr);
          if (group_id < 0 || static_cast<size_t>(group_id) >= groups.size())
            return invalid_argument(describe(d, i), ": no group ", group_id);
          const auto &group = groups[static_cast<size_t>(group_id)];
          if (std::find(group.begin(), group.end(), static_cast<int32_t>(d)) == group.end())
            return invalid_argument(describe(d, i), ": the device is not in group ", group_id);
          const bool per_microbatch = instr.kind == InstrKind::kCompute ||
                                      instr.kind == InstrKind::kReduceScatterAccumulate ||
                                      instr.kind == InstrKind::kGatherParam;
          const std::tuple<InstrKind, int32_t, uint32_t, int32_t> key{
              instr.kind, group_id, instr.index, per_microbatch ? instr.microbatch : -1};
          auto &members = arrived[key];
          members.push_back(part);
          progress = true;
          const bool bucket = instr.kind == InstrKind::kStartBucket;
          if (bucket) {
            // The device records its arrival and goes on; the reduction comes
            // once the last member has arrived.
            order.push_back({{part}});
            ++next[d];
            --left;
          } else {
            waiting[d] = true;
          }
          if (members.size() < group.size()) {
            if (bucket) continue;
            break;
          }
          // Everyone is here: one launch, the members in group order.
          GpuLaunch launch;
          launch.reduce = bucket;
          for (int32_t member : group)
            for (const GpuLaunch::Part &p : members)
              if (p.device == member) launch.parts.push_back(p);
          if (launch.parts.size() != group.size())
            return invalid_argument(describe(d, i), ": group ", group_id,
                                    " was reached twice by one device");
          for (const GpuLaunch::Part &p : launch.parts) {
            if (bucket) {
              reduced.insert({p.device, instr.index});
              continue;
            }
            waiting[static_cast<size_t>(p.device)] = false;
            ++next[static_cast<size_t>(p.device)];
            --left;
          }
          arrived.erase(key);
          order.push_back(std::move(launch));
          continue;
        }
        order.push_back({{part}});
        ++next[d];
        --left;
        progress = true;
      }
    }
    if (!progress) {
      std::string stuck;
      for (size_t d = 0; d < devices; ++d)
        if (next[d] < programs[d].instructions.size())
          stuck += str_cat(stuck.empty() ? "" : "; ", describe(d, next[d]));
      return failed_precondition("the plan's devices cannot all proceed; stuck: ", stuck);
    }
  }
  return order;
}

Result<std::vector<GpuLaunch::Part>>
gpu_matching_sends(const std::vector<serialization::PlanProgram> &programs,
                   const std::vector<GpuLaunch> &order) {
  using serialization::InstrKind;
  std::map<std::tuple<int, int, uint64_t>, std::deque<GpuLaunch::Part>> unreceived;
  std::vector<GpuLaunch::Part> sends(order.size(), GpuLaunch::Part{-1, 0});
  for (size_t k = 0; k < order.size(); ++k) {
    const GpuLaunch &launch = order[k];
    if (launch.reduce) continue;
    const GpuLaunch::Part &lead = launch.parts.at(0);
    const serialization::PlanInstruction &instr =
        programs.at(static_cast<size_t>(lead.device)).instructions.at(lead.instruction);
    if (instr.kind == InstrKind::kSend) {
      unreceived[{lead.device, instr.peer,
                  plan::transfer_tag(instr.index, instr.microbatch)}]
          .push_back(lead);
    } else if (instr.kind == InstrKind::kRecv) {
      auto &queue = unreceived[{instr.peer, lead.device,
                                plan::transfer_tag(instr.index, instr.microbatch)}];
      if (queue.empty())
        return invalid_argument("device ", lead.device, " instruction ", lead.instruction,
                                ": a receive whose send is not before it in the launch order");
      sends[k] = queue.front();
      queue.pop_front();
    }
  }
  return sends;
}

GpuRanks gpu_ranks(const GpuPlacement &placement) {
  GpuRanks ranks;
  std::set<int> gpus(placement.gpu_of_device.begin(), placement.gpu_of_device.end());
  ranks.gpu.assign(gpus.begin(), gpus.end());
  for (int gpu : placement.gpu_of_device)
    ranks.rank_of_device.push_back(static_cast<int>(
        std::lower_bound(ranks.gpu.begin(), ranks.gpu.end(), gpu) - ranks.gpu.begin()));
  return ranks;
}

int gpu_launch_group(const Graph &graph, const std::vector<serialization::PlanProgram> &programs,
                     const GpuLaunch &launch, int tensor_parallel, int tp_groups_begin) {
  using serialization::InstrKind;
  const GpuLaunch::Part &lead = launch.parts.at(0);
  const serialization::PlanInstruction &instr =
      programs.at(static_cast<size_t>(lead.device)).instructions.at(lead.instruction);
  if (launch.reduce || instr.kind == InstrKind::kAllReduce ||
      instr.kind == InstrKind::kReduceScatter || instr.kind == InstrKind::kAllGather ||
      instr.kind == InstrKind::kReduceScatterAccumulate || instr.kind == InstrKind::kGatherParam)
    return instr.peer;
  if (instr.kind == InstrKind::kCompute && tensor_parallel > 1 && instr.index < graph.num_nodes() &&
      ops::communicates_forward(ops::collective_of(graph.node(instr.index).op)))
    return tp_groups_begin + lead.device / tensor_parallel;
  return -1;
}

Result<std::vector<GpuRankStep>>
gpu_rank_steps(const Graph &graph, const std::vector<serialization::PlanProgram> &programs,
               const std::vector<std::vector<int32_t>> &groups, int tensor_parallel,
               int tp_groups_begin, const std::vector<GpuLaunch> &order,
               const GpuPlacement &placement, int rank) {
  using serialization::InstrKind;
  const GpuRanks ranks = gpu_ranks(placement);
  if (rank < 0 || static_cast<size_t>(rank) >= ranks.gpu.size())
    return invalid_argument("rank ", rank, " is not in a run over ", ranks.gpu.size(), " GPU(s)");
  if (placement.gpu_of_device.size() != programs.size())
    return invalid_argument("the placement has ", placement.gpu_of_device.size(),
                            " devices; the plan has ", programs.size());
  auto rank_of = [&](int device) { return ranks.rank_of_device[static_cast<size_t>(device)]; };
  // Groups over several GPUs must have one member per GPU.
  for (size_t g = 0; g < groups.size(); ++g) {
    std::set<int> gpus;
    for (int32_t device : groups[g])
      if (device >= 0 && static_cast<size_t>(device) < programs.size())
        gpus.insert(placement.gpu_of_device[static_cast<size_t>(device)]);
    if (gpus.size() > 1 && placement.group_transport.at(g) != GpuTransport::kNccl)
      return unimplemented("group ", g, " spans ", gpus.size(), " GPUs but ",
                           placement.group_why.at(g),
                           "; a group is either on one GPU or one member per GPU (--gpus)");
  }
  bool flags_shared = false;
  ASSIGN_OR_RETURN(const std::vector<GpuLaunch::Part> sends, gpu_matching_sends(programs, order));
  std::vector<GpuRankStep> steps;
  steps.reserve(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const GpuLaunch &launch = order[k];
    GpuRankStep step;
    const GpuLaunch::Part &lead = launch.parts.at(0);
    const serialization::PlanInstruction &instr =
        programs.at(static_cast<size_t>(lead.device)).instructions.at(lead.instruction);
    if (!flags_shared && !launch.reduce && instr.kind == InstrKind::kUpdate) {
      step.share_flags = true;
      flags_shared = true;
    }
    const int group = gpu_launch_group(graph, programs, launch, tensor_parallel, tp_groups_begin);
    bool all_here = true, any_here = false;
    for (const GpuLaunch::Part &part : launch.parts) {
      const bool here = rank_of(part.device) == rank;
      all_here = all_here && here;
      if (here && !any_here) step.part = part;
      any_here = any_here || here;
    }
    if (!launch.reduce && instr.kind == InstrKind::kSend) {
      if (any_here) step.action = GpuRankAction::kLocal; // staged here either way
    } else if (!launch.reduce && instr.kind == InstrKind::kRecv) {
      const GpuLaunch::Part send = sends[k];
      const int from = rank_of(send.device), to = rank_of(lead.device);
      if (from == rank && to == rank) {
        step.action = GpuRankAction::kLocal;
      } else if (to == rank) {
        step.action = GpuRankAction::kNcclRecv;
        step.peer = from;
      } else if (from == rank) {
        step.action = GpuRankAction::kNcclSend;
        step.part = send;
        step.peer = to;
      }
    } else if (any_here) {
      const bool across = group >= 0 && !all_here;
      step.action = across ? GpuRankAction::kNcclCollective : GpuRankAction::kLocal;
      if (across) step.group = group;
    }
    steps.push_back(step);
  }
  return steps;
}

namespace {

constexpr std::string_view kPeerFailed = "another process of the run failed";

void put_u64(std::string *out, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    out->push_back(static_cast<char>(value >> (8 * i) & 0xff));
}

bool get_u64(std::string_view *in, uint64_t *value) {
  if (in->size() < 8) return false;
  *value = 0;
  for (int i = 0; i < 8; ++i)
    *value |= uint64_t{static_cast<uint8_t>((*in)[static_cast<size_t>(i)])} << (8 * i);
  in->remove_prefix(8);
  return true;
}

// A process's report: its error message (empty: OK), then the outputs it
// keeps as (index, bytes, data).
std::string encode_report(const std::string &error,
                          const std::vector<std::optional<HostTensor>> &outputs) {
  std::string out;
  put_u64(&out, error.size());
  out += error;
  uint64_t kept = 0;
  for (const auto &output : outputs)
    kept += output.has_value() ? 1 : 0;
  put_u64(&out, kept);
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k]) continue;
    put_u64(&out, k);
    put_u64(&out, outputs[k]->size_bytes());
    if (outputs[k]->size_bytes() > 0)
      out.append(reinterpret_cast<const char *>(outputs[k]->data()), outputs[k]->size_bytes());
  }
  return out;
}

// Decodes a report into `error` and the outputs it carries (each must have
// the size `types` gives, and fill a slot not yet filled).
Status decode_report(std::string_view in, const std::vector<TensorType> &types, std::string *error,
                     std::vector<std::optional<HostTensor>> *outputs, std::string_view who) {
  auto bad = [&](std::string_view why) {
    return data_loss("the step report of ", who, " is malformed: ", why);
  };
  uint64_t length = 0, kept = 0;
  if (!get_u64(&in, &length) || in.size() < length) return bad("truncated status");
  *error = std::string(in.substr(0, length));
  in.remove_prefix(length);
  if (!get_u64(&in, &kept)) return bad("no output count");
  for (uint64_t i = 0; i < kept; ++i) {
    uint64_t k = 0, bytes = 0;
    if (!get_u64(&in, &k) || !get_u64(&in, &bytes) || in.size() < bytes)
      return bad("truncated output");
    if (k >= types.size()) return bad(str_cat("output ", k, " of ", types.size()));
    if (static_cast<int64_t>(bytes) != types[k].size_bytes())
      return bad(str_cat("output ", k, " has ", bytes, " bytes, not ", types[k].size_bytes()));
    if (!(*outputs)[k]) {
      HostTensor value = HostTensor::zeros(types[k]);
      if (bytes > 0) std::memcpy(value.data(), in.data(), bytes);
      (*outputs)[k] = std::move(value);
    }
    in.remove_prefix(bytes);
  }
  if (!in.empty()) return bad("trailing bytes");
  return Status::ok();
}

// Whether `error` only says that another process failed.
bool only_peer_failed(const std::string &error) {
  return error.find(kPeerFailed) != std::string::npos ||
         error.find("another GPU of the run failed") != std::string::npos;
}

// Rank 0: the reports of every process combined into one (the first real
// failure, every output from its first keeper).
Result<std::string> combine_reports(const std::vector<std::string> &reports,
                                    const std::vector<TensorType> &types) {
  std::string first;
  std::vector<std::optional<HostTensor>> outputs(types.size());
  for (size_t r = 0; r < reports.size(); ++r) {
    std::string error;
    RETURN_IF_ERROR(decode_report(reports[r], types, &error, &outputs, str_cat("process ", r)));
    if (!error.empty() && (first.empty() || (only_peer_failed(first) && !only_peer_failed(error))))
      first = str_cat("process ", r, ": ", error);
  }
  for (size_t k = 0; k < outputs.size() && first.empty(); ++k)
    if (!outputs[k]) first = str_cat("no process keeps output ", k);
  return encode_report(first, outputs);
}

// Every process's report to rank 0, combined there, and back to all.
Status exchange_reports(ProcessGroup &processes, const Status &mine,
                        std::vector<std::optional<HostTensor>> *outputs,
                        const std::vector<TensorType> &types, std::string_view what) {
  std::string report = encode_report(mine.is_ok() ? std::string() : mine.message(), *outputs);
  // Where the exchange itself fails (the group ended by a failure), a
  // process that failed keeps its own error.
  auto exchange_failed = [&](const Status &exchange) { return mine.is_ok() ? exchange : mine; };
  std::vector<std::string> all;
  if (Status gathered = processes.gather(report, &all, what); !gathered.is_ok())
    return exchange_failed(gathered);
  std::string combined;
  if (processes.rank() == 0) {
    auto made = combine_reports(all, types);
    combined = made.is_ok() ? *made : encode_report(made.status().message(), {});
  }
  if (Status sent = processes.broadcast(&combined, what); !sent.is_ok())
    return exchange_failed(sent);
  std::string error;
  std::vector<std::optional<HostTensor>> shared(types.size());
  RETURN_IF_ERROR(decode_report(combined, types, &error, &shared, "rank 0"));
  if (!error.empty()) {
    if (!mine.is_ok() && error.find(mine.message()) != std::string::npos) return mine;
    return failed_precondition(
        error.find(kPeerFailed) == std::string::npos ? str_cat(kPeerFailed, ": ", error) : error);
  }
  *outputs = std::move(shared);
  return Status::ok();
}

} // namespace

Status agree_across(ProcessGroup &processes, const Status &mine, std::string_view what) {
  std::vector<std::optional<HostTensor>> none;
  return exchange_reports(processes, mine, &none, {}, what);
}

Status share_step_results(ProcessGroup &processes, const Status &mine,
                          const std::vector<TensorType> &types,
                          std::vector<std::optional<HostTensor>> *outputs) {
  if (outputs->size() != types.size())
    return invalid_argument(outputs->size(), " outputs of ", types.size(), " types");
  return exchange_reports(processes, mine, outputs, types, "the step's outputs");
}

std::vector<ProgramChain> program_chains(const Graph &graph,
                                         const serialization::PlanProgram &program,
                                         const std::vector<std::vector<NodeId>> &chains) {
  using serialization::InstrKind;
  std::map<NodeId, size_t> starting; // first node -> chain
  for (size_t c = 0; c < chains.size(); ++c)
    if (chains[c].size() >= 2) starting.emplace(chains[c].front(), c);
  std::map<std::pair<TensorId, int32_t>, int64_t> slot;
  for (const serialization::PlanSlot &s : program.slots)
    slot[{s.tensor, s.microbatch}] = s.offset;
  auto bytes = [&](TensorId t) { return graph.tensor(t).type.size_bytes(); };
  // Tensors the program's other instructions name (sends, accumulations,
  // reductions, buckets): a chain whose intermediate is one of them would
  // leave it unwritten, so it stays unfused (the lowering makes none today).
  std::set<TensorId> named;
  for (const serialization::PlanInstruction &instr : program.instructions)
    if (instr.kind != InstrKind::kCompute && instr.kind != InstrKind::kComputeShard &&
        instr.kind != InstrKind::kStartBucket && instr.kind != InstrKind::kWaitBucket &&
        instr.kind != InstrKind::kUpdate)
      named.insert(instr.index);
  for (const serialization::PlanBucket &bucket : program.buckets)
    named.insert(bucket.tensors.begin(), bucket.tensors.end());
  for (const StateUpdate &update : graph.updates())
    named.insert(update.value);
  std::vector<ProgramChain> runs;
  const auto &instructions = program.instructions;
  for (size_t i = 0; i < instructions.size(); ++i) {
    const serialization::PlanInstruction &head = instructions[i];
    if (head.kind != InstrKind::kCompute || head.index >= graph.num_nodes()) continue;
    auto found = starting.find(head.index);
    if (found == starting.end()) continue;
    const std::vector<NodeId> &chain = chains[found->second];
    if (i + chain.size() > instructions.size()) continue;
    bool whole = true;
    for (size_t j = 0; j < chain.size() && whole; ++j) {
      const serialization::PlanInstruction &instr = instructions[i + j];
      whole = instr.kind == InstrKind::kCompute && instr.index == chain[j] &&
              instr.microbatch == head.microbatch;
    }
    for (size_t j = 0; j + 1 < chain.size() && whole; ++j)
      whole = !named.contains(graph.node(chain[j]).outputs[0]);
    if (!whole) continue;
    const TensorId out = graph.node(chain.back()).outputs[0];
    auto out_slot = slot.find({out, head.microbatch});
    if (out_slot == slot.end()) continue;
    const int64_t out_begin = out_slot->second, out_end = out_begin + bytes(out);
    bool apart = true;
    for (NodeId id : chain)
      for (TensorId t : graph.node(id).inputs) {
        if (std::find(chain.begin(), chain.end(), graph.tensor(t).producer) != chain.end())
          continue; // the chain's own intermediate: never written
        auto in = slot.find({t, head.microbatch});
        if (in == slot.end()) in = slot.find({t, -1});
        if (in == slot.end()) continue; // a weight or the batch: not in the arena
        apart = apart && (in->second + bytes(t) <= out_begin || out_end <= in->second);
      }
    if (!apart) continue;
    runs.push_back({i, i + chain.size() - 1, found->second});
    i += chain.size() - 1;
  }
  return runs;
}

void CaptureRecord::add(std::string name, const void *address, TensorType type) {
  buffers_.push_back({std::move(name), address, std::move(type)});
}

Status CaptureRecord::check_replay(const CaptureRecord &replay) const {
  const size_t n = std::min(buffers_.size(), replay.buffers_.size());
  for (size_t i = 0; i < n; ++i) {
    const Buffer &was = buffers_[i], &now = replay.buffers_[i];
    if (was.name != now.name)
      return failed_precondition("CUDA Graph replay: buffer ", i, " is '", now.name,
                                 "' but the step was captured with '", was.name,
                                 "' there; capture again (or run with --no-cuda-graph)");
    if (!(was.type == now.type))
      return failed_precondition("CUDA Graph replay: '", now.name, "' is ", now.type.to_string(),
                                 " but was ", was.type.to_string(),
                                 " at capture; the captured kernels would use the old shape");
    if (was.address != now.address)
      return failed_precondition("CUDA Graph replay: '", now.name, "' moved from ", was.address,
                                 " to ", now.address,
                                 " since capture; the captured kernels would touch the old memory");
  }
  if (buffers_.size() != replay.buffers_.size())
    return failed_precondition("CUDA Graph replay binds ", replay.buffers_.size(),
                               " buffers; the step was captured with ", buffers_.size());
  return Status::ok();
}

} // namespace strata::runtime
