#include "plan/simulate.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "plan/instructions.h"

namespace strata::plan {

using serialization::InstrKind;
using serialization::PlanInstruction;
using serialization::PlanProgram;

SimulationCosts zero_costs() {
  SimulationCosts costs;
  costs.compute = [](NodeId) { return 0.0; };
  costs.transfer = [](int, int, double) { return 0.0; };
  costs.local_copy = [](double) { return 0.0; };
  return costs;
}

namespace {

// What the simulation needs of the programs and groups before it starts:
// every grouped instruction names a group that includes its device and
// devices that have programs, and programs come in device order.
Status check_programs(const Graph &graph, const std::vector<PlanProgram> &programs,
                      const std::vector<std::vector<int32_t>> &groups) {
  const size_t P = programs.size();
  for (size_t d = 0; d < P; ++d)
    for (size_t i = 0; i < programs[d].instructions.size(); ++i) {
      const PlanInstruction &instr = programs[d].instructions[i];
      if (!is_grouped(instr.kind)) continue;
      if (instr.peer < 0 || static_cast<size_t>(instr.peer) >= groups.size())
        return invalid_argument("device ", d, " instruction ", i, " (",
                                describe_instruction(graph, instr), "): there are ", groups.size(),
                                " groups");
      const auto &group = groups[static_cast<size_t>(instr.peer)];
      if (std::find(group.begin(), group.end(), static_cast<int32_t>(d)) == group.end())
        return invalid_argument("device ", d, " instruction ", i, " (",
                                describe_instruction(graph, instr),
                                "): the group does not include the device");
      if (is_bucket(instr.kind) && instr.index >= programs[d].buckets.size())
        return invalid_argument("device ", d, " instruction ", i, " (",
                                describe_instruction(graph, instr), "): the program has ",
                                programs[d].buckets.size(), " buckets");
      for (int32_t member : group)
        if (member < 0 || static_cast<size_t>(member) >= P)
          return invalid_argument("group ", instr.peer, " names device ", member,
                                  ", which has no program");
    }
  for (size_t d = 0; d < P; ++d)
    if (programs[d].device != d)
      return invalid_argument("program ", d, " is for device ", programs[d].device,
                              "; programs must be listed in device order");
  return Status::ok();
}

// Collectives: every member's k-th all-reduce on a group meets the others'.
// Per (group, k): the members arrived so far and the latest arrival time.
struct Meeting {
  std::set<size_t> arrived;
  double latest = 0;
  std::string tensor; // what the first arrival reduces, to catch mismatches
  InstrKind kind = InstrKind::kAllReduce;
  int32_t microbatch = -1;
};

// Gradient buckets run on each device's communication stream: the k-th bucket
// started on a group begins once every member has started it and every
// member's stream is free, and a WaitBucket waits for its end.
struct BucketMeeting {
  std::set<size_t> arrived;
  double latest = 0;
  double bytes = 0;
  bool reduce_scatter = false;
  bool gather = false; // a ZeRO-3 StartGather's all-gather, not a bucket
  double end = -1;     // when reduced; -1 until every member has started it
};

// One simulation: each device runs its program until it must wait, in turns,
// until none can go on; whatever is left is a deadlock.
class Simulator {
public:
  Simulator(const Graph &graph, const std::vector<PlanProgram> &programs,
            const SimulationCosts &costs, const std::vector<std::vector<int32_t>> &groups);

  // Runs every device as far as it goes. Errors: mismatched collectives or
  // buckets, waiting for a bucket never started.
  Status run();
  // After run(): the deadlock where a device is stuck, naming the device
  // that its chain of waits ends at and what that waits for.
  Status check_deadlock();
  // After run(): a send that nobody receives.
  Status check_unmatched_sends() const;
  // After run(): the timeline, with every device's end, the step time and
  // the bubble.
  Simulation finish();

private:
  bool finished(size_t d) const { return pc_[d] >= programs_[d].instructions.size(); }
  double bytes_of(TensorId t) const {
    return t < graph_.num_tensors() ? static_cast<double>(graph_.tensor(t).type.size_bytes()) : 0.0;
  }
  // Runs device d's next instruction: false when it must wait instead.
  Result<bool> execute(size_t d);
  // Each sets `end` and returns true, or returns false while the instruction
  // must wait.
  bool receive(size_t d, const PlanInstruction &instr, double start, double &end);
  Result<bool> meet_collective(size_t d, const PlanInstruction &instr, double start, double &end);
  Status start_bucket(size_t d, const PlanInstruction &instr, double start);
  Result<bool> wait_bucket(size_t d, const PlanInstruction &instr, double start, double &end);
  // A bucket or a ZeRO-3 gather handed to the members' communication
  // streams: it runs once every member has started it and each member's
  // stream is free. The key of its meeting.
  Result<std::pair<int32_t, size_t>> start_on_stream(size_t d, const PlanInstruction &instr,
                                                     double start, double bytes,
                                                     bool reduce_scatter, bool gather);
  // The meeting (group, number) of the bucket or gather a wait names.
  std::optional<std::pair<int32_t, size_t>> stream_task(size_t d, const PlanInstruction &instr);
  // The members that reached the collective or bucket device d waits at.
  const std::set<size_t> *arrived_at(size_t d, const PlanInstruction &instr);
  // The device to report: the end of the chain of waits from the first stuck
  // device, or P when none is stuck.
  size_t stuck_device();
  // Why stuck device d waits forever.
  Status deadlock_error(size_t d);

  const Graph &graph_;
  const std::vector<PlanProgram> &programs_;
  const SimulationCosts &costs_;
  const std::vector<std::vector<int32_t>> &groups_;
  const size_t P_; // devices
  Simulation sim_;
  std::vector<size_t> pc_;
  std::vector<double> clock_;
  // In-flight messages per (source, destination, tag): arrival times, and the
  // sending instruction for error messages.
  std::map<std::tuple<int, int, uint64_t>, std::deque<std::pair<double, size_t>>> channels_;
  std::map<std::pair<int32_t, size_t>, Meeting> meetings_;
  std::vector<std::map<int32_t, size_t>> collectives_done_; // per device, per group
  std::map<std::pair<int32_t, size_t>, BucketMeeting> bucket_meetings_;
  std::vector<std::map<int32_t, size_t>> buckets_started_;                // per device, per group
  std::vector<std::map<uint32_t, std::pair<int32_t, size_t>>> bucket_of_; // bucket -> meeting
  // Per device: ZeRO-3 (parameter, block) started on the stream -> meeting.
  std::vector<std::map<std::pair<TensorId, int32_t>, std::pair<int32_t, size_t>>> gather_of_;
  std::vector<double> stream_free_;
  // Per device: the tensors it reduce-scatters into shards (ZeRO-2), and the
  // members they are shared by.
  std::vector<std::map<TensorId, double>> shards_;
};

Simulator::Simulator(const Graph &graph, const std::vector<PlanProgram> &programs,
                     const SimulationCosts &costs, const std::vector<std::vector<int32_t>> &groups)
    : graph_(graph), programs_(programs), costs_(costs), groups_(groups), P_(programs.size()),
      pc_(P_, 0), clock_(P_, 0.0), collectives_done_(P_), buckets_started_(P_), bucket_of_(P_),
      gather_of_(P_), stream_free_(P_, 0.0), shards_(P_) {
  for (size_t d = 0; d < P_; ++d)
    for (const PlanInstruction &instr : programs[d].instructions)
      if (instr.kind == InstrKind::kReduceScatterAccumulate)
        shards_[d][instr.index] =
            static_cast<double>(groups[static_cast<size_t>(instr.peer)].size());
  sim_.devices.resize(P_);
  sim_.busy.assign(P_, 0.0);
  sim_.end.assign(P_, 0.0);
  for (size_t d = 0; d < P_; ++d)
    sim_.devices[d].resize(programs[d].instructions.size());
}

Status Simulator::run() {
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t d = 0; d < P_; ++d)
      while (!finished(d)) {
        ASSIGN_OR_RETURN(const bool ran, execute(d));
        if (!ran) break;
        progress = true;
      }
  }
  return Status::ok();
}

Result<bool> Simulator::execute(size_t d) {
  const PlanInstruction &instr = programs_[d].instructions[pc_[d]];
  const double start = clock_[d];
  double end = start;
  switch (instr.kind) {
  case InstrKind::kCompute: end = start + costs_.compute(instr.index); break;
  case InstrKind::kSend: {
    const double arrival =
        start + costs_.transfer(static_cast<int>(d), instr.peer, bytes_of(instr.index));
    channels_[{static_cast<int>(d), instr.peer, transfer_tag(instr.index, instr.microbatch)}]
        .push_back({arrival, pc_[d]});
    break;
  }
  case InstrKind::kRecv:
    if (!receive(d, instr, start, end)) return false;
    break;
  case InstrKind::kAccumulate: end = start + costs_.local_copy(3 * bytes_of(instr.index)); break;
  case InstrKind::kScale: {
    // A ZeRO-2 step buffer holds the device's shard only.
    auto shard = shards_[d].find(instr.index);
    const double parts = shard == shards_[d].end() ? 1.0 : shard->second;
    end = start + costs_.local_copy(2 * bytes_of(instr.index) / parts);
    break;
  }
  case InstrKind::kUpdate:
    if (instr.index < graph_.updates().size())
      end = start + costs_.local_copy(2 * bytes_of(graph_.updates()[instr.index].target));
    break;
  case InstrKind::kComputeShard:
    end = start + costs_.compute(instr.index) /
                      static_cast<double>(groups_[static_cast<size_t>(instr.peer)].size());
    break;
  case InstrKind::kAllReduce:
  case InstrKind::kReduceScatter:
  case InstrKind::kAllGather:
  case InstrKind::kReduceScatterAccumulate:
  case InstrKind::kGatherParam: {
    ASSIGN_OR_RETURN(const bool met, meet_collective(d, instr, start, end));
    if (!met) return false;
    break;
  }
  case InstrKind::kStartBucket:
    RETURN_IF_ERROR(start_bucket(d, instr, start));
    break; // the device goes on at once
  case InstrKind::kStartGather: {
    ASSIGN_OR_RETURN(const auto key,
                     start_on_stream(d, instr, start, bytes_of(instr.index), false, true));
    gather_of_[d][{instr.index, instr.microbatch}] = key;
    break;
  }
  case InstrKind::kWaitBucket:
  case InstrKind::kWaitGather: {
    ASSIGN_OR_RETURN(const bool reduced, wait_bucket(d, instr, start, end));
    if (!reduced) return false;
    break;
  }
  }
  sim_.devices[d][pc_[d]] = {start, end};
  // Waiting for a bucket is exposed communication, busy like a blocking
  // all-reduce; the bubble is the pipeline's idle time.
  if (instr.kind != InstrKind::kRecv) sim_.busy[d] += end - start;
  clock_[d] = end;
  ++pc_[d];
  return true;
}

bool Simulator::receive(size_t d, const PlanInstruction &instr, double start, double &end) {
  auto it = channels_.find(
      {instr.peer, static_cast<int>(d), transfer_tag(instr.index, instr.microbatch)});
  if (it == channels_.end() || it->second.empty()) return false;
  end = std::max(start, it->second.front().first);
  it->second.pop_front();
  return true;
}

Result<bool> Simulator::meet_collective(size_t d, const PlanInstruction &instr, double start,
                                        double &end) {
  const auto &group = groups_[static_cast<size_t>(instr.peer)];
  const size_t k = collectives_done_[d][instr.peer];
  Meeting &meeting = meetings_[{instr.peer, k}];
  const std::string tensor = graph_.tensor(instr.index).name;
  if (meeting.arrived.empty()) {
    meeting.tensor = tensor;
    meeting.kind = instr.kind;
    meeting.microbatch = instr.microbatch;
  }
  if (meeting.tensor != tensor || meeting.kind != instr.kind ||
      meeting.microbatch != instr.microbatch)
    return failed_precondition("mismatched collective: device ", d, " instruction ", pc_[d], " (",
                               describe_instruction(graph_, instr), ") meets ",
                               serialization::instr_kind_name(meeting.kind), " of '",
                               meeting.tensor, "' ", microbatch_text(meeting.microbatch),
                               " from device ", *meeting.arrived.begin(), " as collective number ",
                               k, " of group ", instr.peer);
  if (meeting.arrived.insert(d).second) meeting.latest = std::max(meeting.latest, start);
  if (meeting.arrived.size() < group.size()) return false;
  const bool scatters =
      instr.kind == InstrKind::kReduceScatter || instr.kind == InstrKind::kReduceScatterAccumulate;
  const auto &cost = instr.kind == InstrKind::kAllReduce ? costs_.all_reduce
                     : scatters                          ? costs_.reduce_scatter
                                                         : costs_.all_gather;
  end = meeting.latest + (cost ? cost(group, bytes_of(instr.index)) : 0.0);
  // ZeRO-2: then the device's shard is added into its step buffer.
  if (instr.kind == InstrKind::kReduceScatterAccumulate && costs_.local_copy)
    end += costs_.local_copy(3 * bytes_of(instr.index) / static_cast<double>(group.size()));
  ++collectives_done_[d][instr.peer];
  return true;
}

Status Simulator::start_bucket(size_t d, const PlanInstruction &instr, double start) {
  const auto &bucket = programs_[d].buckets.at(instr.index);
  double bytes = 0;
  for (TensorId t : bucket.tensors)
    bytes += bytes_of(t);
  ASSIGN_OR_RETURN(bucket_of_[d][instr.index],
                   start_on_stream(d, instr, start, bytes, bucket.reduce_scatter, false));
  return Status::ok();
}

Result<std::pair<int32_t, size_t>> Simulator::start_on_stream(size_t d,
                                                              const PlanInstruction &instr,
                                                              double start, double bytes,
                                                              bool reduce_scatter, bool gather) {
  const auto &group = groups_[static_cast<size_t>(instr.peer)];
  const std::pair<int32_t, size_t> key{instr.peer, buckets_started_[d][instr.peer]++};
  BucketMeeting &meeting = bucket_meetings_[key];
  if (meeting.arrived.empty()) {
    meeting.bytes = bytes;
    meeting.reduce_scatter = reduce_scatter;
    meeting.gather = gather;
  }
  auto kind = [](bool scatters, bool gathers) {
    return gathers ? "gather" : scatters ? "reduce-scatter" : "all-reduce";
  };
  if (meeting.bytes != bytes || meeting.reduce_scatter != reduce_scatter ||
      meeting.gather != gather)
    return failed_precondition(
        gather || meeting.gather ? "mismatched parameter gather: device "
                                 : "mismatched gradient bucket: device ",
        d, " instruction ", pc_[d], " (", describe_instruction(graph_, instr), ") starts ", bytes,
        " bytes (", kind(reduce_scatter, gather), ") as stream task number ", key.second,
        " of group ", instr.peer, ", but device ", *meeting.arrived.begin(), " started ",
        meeting.bytes, " bytes (", kind(meeting.reduce_scatter, meeting.gather), ")");
  meeting.arrived.insert(d);
  meeting.latest = std::max(meeting.latest, start);
  if (meeting.arrived.size() == group.size()) {
    double begin = meeting.latest;
    for (int32_t m : group)
      begin = std::max(begin, stream_free_[static_cast<size_t>(m)]);
    const auto &cost = gather           ? costs_.all_gather
                       : reduce_scatter ? costs_.reduce_scatter
                                        : costs_.all_reduce;
    meeting.end = begin + (cost ? cost(group, bytes) : 0.0);
    for (int32_t m : group)
      stream_free_[static_cast<size_t>(m)] = meeting.end;
  }
  return key;
}

std::optional<std::pair<int32_t, size_t>> Simulator::stream_task(size_t d,
                                                                 const PlanInstruction &instr) {
  if (instr.kind == InstrKind::kWaitGather) {
    auto it = gather_of_[d].find({instr.index, instr.microbatch});
    if (it == gather_of_[d].end()) return std::nullopt;
    return it->second;
  }
  auto it = bucket_of_[d].find(instr.index);
  if (it == bucket_of_[d].end()) return std::nullopt;
  return it->second;
}

Result<bool> Simulator::wait_bucket(size_t d, const PlanInstruction &instr, double start,
                                    double &end) {
  const auto task = stream_task(d, instr);
  if (!task)
    return failed_precondition("device ", d, " instruction ", pc_[d], " (",
                               describe_instruction(graph_, instr), ") waits for ",
                               instr.kind == InstrKind::kWaitGather ? "a gather" : "a bucket",
                               " it never started");
  const BucketMeeting &meeting = bucket_meetings_[*task];
  if (meeting.end < 0) return false;
  end = std::max(start, meeting.end);
  return true;
}

const std::set<size_t> *Simulator::arrived_at(size_t d, const PlanInstruction &instr) {
  if (instr.kind == InstrKind::kWaitBucket || instr.kind == InstrKind::kWaitGather) {
    const auto task = stream_task(d, instr);
    return task ? &bucket_meetings_[*task].arrived : nullptr;
  }
  if (is_collective(instr.kind))
    return &meetings_[{instr.peer, collectives_done_[d][instr.peer]}].arrived;
  return nullptr;
}

// Follows the chain of waits from the first stuck device (device d waits for
// its receive's peer, which may itself wait for another) to its end: a peer
// that never sends, or the first device seen twice (a cycle).
size_t Simulator::stuck_device() {
  size_t first_stuck = P_;
  for (size_t d = 0; d < P_ && first_stuck == P_; ++d)
    if (!finished(d)) first_stuck = d;
  if (first_stuck == P_) return P_;
  std::vector<bool> seen(P_, false);
  size_t d = first_stuck;
  while (true) {
    seen[d] = true;
    const PlanInstruction &waiting = programs_[d].instructions[pc_[d]];
    auto next = static_cast<size_t>(waiting.peer);
    if (const std::set<size_t> *arrived = arrived_at(d, waiting)) {
      // A collective or a bucket waits for the first member that has not
      // arrived (started it).
      next = P_;
      for (int32_t member : groups_[static_cast<size_t>(waiting.peer)])
        if (!arrived->contains(static_cast<size_t>(member))) {
          next = static_cast<size_t>(member);
          break;
        }
    }
    if (next >= P_ || finished(next) || seen[next]) break;
    d = next;
  }
  return d;
}

// Reports the last receive of the chain and what its peer is doing.
Status Simulator::check_deadlock() {
  for (size_t d = stuck_device(); d < P_; ++d) {
    if (pc_[d] == programs_[d].instructions.size()) continue;
    return deadlock_error(d);
  }
  return Status::ok();
}

Status Simulator::deadlock_error(size_t d) {
  const PlanInstruction &instr = programs_[d].instructions[pc_[d]];
  size_t stuck = 0;
  for (size_t e = 0; e < P_; ++e)
    if (!finished(e)) ++stuck;
  std::string head = str_cat("deadlock: device ", d, " instruction ", pc_[d], " (",
                             describe_instruction(graph_, instr), ") waits forever");
  if (const std::set<size_t> *arrived = arrived_at(d, instr)) {
    const bool bucket =
        instr.kind == InstrKind::kWaitBucket || instr.kind == InstrKind::kWaitGather;
    for (int32_t member : groups_[static_cast<size_t>(instr.peer)]) {
      const auto m = static_cast<size_t>(member);
      if (arrived->contains(m)) continue;
      return failed_precondition(
          head, ": device ", m, " of the group ",
          !finished(m) ? str_cat("is blocked at instruction ", pc_[m], " (",
                                 describe_instruction(graph_, programs_[m].instructions[pc_[m]]),
                                 ")", bucket ? " without having started it" : "")
                       : std::string(bucket ? "has finished without starting it"
                                            : "has finished without it"),
          " (", stuck, " devices stuck)");
    }
  }
  const auto peer = static_cast<size_t>(instr.peer);
  if (instr.peer < 0 || peer >= P_)
    return failed_precondition(head, ": there is no device ", instr.peer);
  const auto &peer_instrs = programs_[peer].instructions;
  std::optional<size_t> later_send;
  for (size_t i = pc_[peer]; i < peer_instrs.size(); ++i) {
    const PlanInstruction &p = peer_instrs[i];
    if (p.kind == InstrKind::kSend && p.peer == static_cast<int>(d) && p.index == instr.index &&
        p.microbatch == instr.microbatch) {
      later_send = i;
      break;
    }
  }
  std::string peer_state = pc_[peer] < peer_instrs.size()
                               ? str_cat("is blocked at instruction ", pc_[peer], " (",
                                         describe_instruction(graph_, peer_instrs[pc_[peer]]), ")")
                               : std::string("has finished");
  if (later_send)
    return failed_precondition(head, ": device ", peer, " sends it only at instruction ",
                               *later_send, " but ", peer_state, " (", stuck, " devices stuck)");
  return failed_precondition(head, ": device ", peer, " never sends it; device ", peer, " ",
                             peer_state, " (", stuck, " devices stuck)");
}

Status Simulator::check_unmatched_sends() const {
  for (const auto &[key, queue] : channels_) {
    if (queue.empty()) continue;
    const auto [src, dst, tag] = key;
    const size_t at = queue.front().second;
    return failed_precondition(
        "unmatched send: device ", src, " instruction ", at, " (",
        describe_instruction(graph_, programs_[static_cast<size_t>(src)].instructions[at]),
        ") is never received by device ", dst);
  }
  return Status::ok();
}

Simulation Simulator::finish() {
  for (size_t d = 0; d < P_; ++d) {
    sim_.end[d] = clock_[d];
    sim_.step_time = std::max(sim_.step_time, clock_[d]);
  }
  double busy = 0;
  for (double b : sim_.busy)
    busy += b;
  sim_.bubble = sim_.step_time > 0
                    ? std::clamp(1.0 - busy / (static_cast<double>(P_) * sim_.step_time), 0.0, 1.0)
                    : 0.0;
  return std::move(sim_);
}

} // namespace

Result<Simulation> simulate_pipeline(const Graph &graph, const std::vector<PlanProgram> &programs,
                                     const SimulationCosts &costs,
                                     const std::vector<std::vector<int32_t>> &groups) {
  RETURN_IF_ERROR(check_programs(graph, programs, groups));
  Simulator simulator(graph, programs, costs, groups);
  RETURN_IF_ERROR(simulator.run());
  RETURN_IF_ERROR(simulator.check_deadlock());
  RETURN_IF_ERROR(simulator.check_unmatched_sends());
  return simulator.finish();
}

Status check_deadlock(const Graph &graph, const std::vector<PlanProgram> &programs,
                      const std::vector<std::vector<int32_t>> &groups) {
  return simulate_pipeline(graph, programs, zero_costs(), groups).status();
}

} // namespace strata::plan
