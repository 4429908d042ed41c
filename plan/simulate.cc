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

Result<Simulation> simulate_pipeline(const Graph &graph, const std::vector<PlanProgram> &programs,
                                     const SimulationCosts &costs,
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
  Simulation sim;
  sim.devices.resize(P);
  sim.busy.assign(P, 0.0);
  sim.end.assign(P, 0.0);
  for (size_t d = 0; d < P; ++d)
    sim.devices[d].resize(programs[d].instructions.size());
  std::vector<size_t> pc(P, 0);
  std::vector<double> clock(P, 0.0);
  // In-flight messages per (source, destination, tag): arrival times, and the
  // sending instruction for error messages.
  std::map<std::tuple<int, int, uint64_t>, std::deque<std::pair<double, size_t>>> channels;
  // Collectives: every member's k-th all-reduce on a group meets the others'.
  // Per (group, k): the members arrived so far and the latest arrival time.
  struct Meeting {
    std::set<size_t> arrived;
    double latest = 0;
    std::string tensor; // what the first arrival reduces, to catch mismatches
    InstrKind kind = InstrKind::kAllReduce;
  };
  std::map<std::pair<int32_t, size_t>, Meeting> meetings;
  std::vector<std::map<int32_t, size_t>> collectives_done(P); // per device, per group
  // Gradient buckets run on each device's communication stream: the k-th bucket
  // started on a group begins once every member has started it and every
  // member's stream is free, and a WaitBucket waits for its end.
  struct BucketMeeting {
    std::set<size_t> arrived;
    double latest = 0;
    double bytes = 0;
    bool reduce_scatter = false;
    double end = -1; // when reduced; -1 until every member has started it
  };
  std::map<std::pair<int32_t, size_t>, BucketMeeting> bucket_meetings;
  std::vector<std::map<int32_t, size_t>> buckets_started(P);                // per device, per group
  std::vector<std::map<uint32_t, std::pair<int32_t, size_t>>> bucket_of(P); // bucket -> meeting
  std::vector<double> stream_free(P, 0.0);

  auto bytes_of = [&](TensorId t) {
    return t < graph.num_tensors() ? static_cast<double>(graph.tensor(t).type.size_bytes()) : 0.0;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t d = 0; d < P; ++d) {
      const auto &instrs = programs[d].instructions;
      while (pc[d] < instrs.size()) {
        const PlanInstruction &instr = instrs[pc[d]];
        const double start = clock[d];
        double end = start;
        switch (instr.kind) {
        case InstrKind::kCompute: end = start + costs.compute(instr.index); break;
        case InstrKind::kSend: {
          const double arrival =
              start + costs.transfer(static_cast<int>(d), instr.peer, bytes_of(instr.index));
          channels[{static_cast<int>(d), instr.peer, transfer_tag(instr.index, instr.microbatch)}]
              .push_back({arrival, pc[d]});
          break;
        }
        case InstrKind::kRecv: {
          auto it = channels.find(
              {instr.peer, static_cast<int>(d), transfer_tag(instr.index, instr.microbatch)});
          if (it == channels.end() || it->second.empty()) goto blocked;
          end = std::max(start, it->second.front().first);
          it->second.pop_front();
          break;
        }
        case InstrKind::kAccumulate:
          end = start + costs.local_copy(3 * bytes_of(instr.index));
          break;
        case InstrKind::kScale: end = start + costs.local_copy(2 * bytes_of(instr.index)); break;
        case InstrKind::kUpdate:
          if (instr.index < graph.updates().size())
            end = start + costs.local_copy(2 * bytes_of(graph.updates()[instr.index].target));
          break;
        case InstrKind::kComputeShard:
          end = start + costs.compute(instr.index) /
                            static_cast<double>(groups[static_cast<size_t>(instr.peer)].size());
          break;
        case InstrKind::kAllReduce:
        case InstrKind::kReduceScatter:
        case InstrKind::kAllGather: {
          const auto &group = groups[static_cast<size_t>(instr.peer)];
          const size_t k = collectives_done[d][instr.peer];
          Meeting &meeting = meetings[{instr.peer, k}];
          const std::string tensor = graph.tensor(instr.index).name;
          if (meeting.arrived.empty()) {
            meeting.tensor = tensor;
            meeting.kind = instr.kind;
          }
          if (meeting.tensor != tensor || meeting.kind != instr.kind)
            return failed_precondition("mismatched collective: device ", d, " instruction ", pc[d],
                                       " (", describe_instruction(graph, instr), ") meets ",
                                       serialization::instr_kind_name(meeting.kind), " of '",
                                       meeting.tensor, "' from device ", *meeting.arrived.begin(),
                                       " as collective number ", k, " of group ", instr.peer);
          if (meeting.arrived.insert(d).second) meeting.latest = std::max(meeting.latest, start);
          if (meeting.arrived.size() < group.size()) goto blocked;
          const auto &cost = instr.kind == InstrKind::kAllReduce       ? costs.all_reduce
                             : instr.kind == InstrKind::kReduceScatter ? costs.reduce_scatter
                                                                       : costs.all_gather;
          end = meeting.latest + (cost ? cost(group, bytes_of(instr.index)) : 0.0);
          ++collectives_done[d][instr.peer];
          break;
        }
        case InstrKind::kStartBucket: {
          const auto &group = groups[static_cast<size_t>(instr.peer)];
          const auto &bucket = programs[d].buckets.at(instr.index);
          double bytes = 0;
          for (TensorId t : bucket.tensors)
            bytes += bytes_of(t);
          const std::pair<int32_t, size_t> key{instr.peer, buckets_started[d][instr.peer]++};
          bucket_of[d][instr.index] = key;
          BucketMeeting &meeting = bucket_meetings[key];
          if (meeting.arrived.empty()) {
            meeting.bytes = bytes;
            meeting.reduce_scatter = bucket.reduce_scatter;
          }
          if (meeting.bytes != bytes || meeting.reduce_scatter != bucket.reduce_scatter)
            return failed_precondition(
                "mismatched gradient bucket: device ", d, " instruction ", pc[d], " (",
                describe_instruction(graph, instr), ") starts ", bytes, " bytes (",
                bucket.reduce_scatter ? "reduce-scatter" : "all-reduce", ") as bucket number ",
                key.second, " of group ", instr.peer, ", but device ", *meeting.arrived.begin(),
                " started ", meeting.bytes, " bytes (",
                meeting.reduce_scatter ? "reduce-scatter" : "all-reduce", ")");
          meeting.arrived.insert(d);
          meeting.latest = std::max(meeting.latest, start);
          if (meeting.arrived.size() == group.size()) {
            double begin = meeting.latest;
            for (int32_t m : group)
              begin = std::max(begin, stream_free[static_cast<size_t>(m)]);
            const auto &cost = bucket.reduce_scatter ? costs.reduce_scatter : costs.all_reduce;
            meeting.end = begin + (cost ? cost(group, bytes) : 0.0);
            for (int32_t m : group)
              stream_free[static_cast<size_t>(m)] = meeting.end;
          }
          break; // the device goes on at once
        }
        case InstrKind::kWaitBucket: {
          auto it = bucket_of[d].find(instr.index);
          if (it == bucket_of[d].end())
            return failed_precondition("device ", d, " instruction ", pc[d], " (",
                                       describe_instruction(graph, instr),
                                       ") waits for a bucket it never started");
          const BucketMeeting &meeting = bucket_meetings[it->second];
          if (meeting.end < 0) goto blocked;
          end = std::max(start, meeting.end);
          break;
        }
        }
        sim.devices[d][pc[d]] = {start, end};
        // Waiting for a bucket is exposed communication, busy like a blocking
        // all-reduce; the bubble is the pipeline's idle time.
        if (instr.kind != InstrKind::kRecv) sim.busy[d] += end - start;
        clock[d] = end;
        ++pc[d];
        progress = true;
      }
    blocked:;
    }
  }

  // The members that reached the collective or bucket device d waits at.
  auto arrived_at = [&](size_t d, const PlanInstruction &instr) -> const std::set<size_t> * {
    if (instr.kind == InstrKind::kWaitBucket)
      return &bucket_meetings[bucket_of[d][instr.index]].arrived;
    if (is_collective(instr.kind))
      return &meetings[{instr.peer, collectives_done[d][instr.peer]}].arrived;
    return nullptr;
  };
  // Deadlock: follow the chain of waits from the first stuck device (device d
  // waits for its receive's peer, which may itself wait for another) to its end:
  // a peer that never sends, or the first device seen twice (a cycle). Report
  // the last receive of the chain and what its peer is doing.
  size_t first_stuck = P;
  for (size_t d = 0; d < P && first_stuck == P; ++d)
    if (pc[d] < programs[d].instructions.size()) first_stuck = d;
  if (first_stuck < P) {
    std::vector<bool> seen(P, false);
    size_t d = first_stuck;
    while (true) {
      seen[d] = true;
      const PlanInstruction &waiting = programs[d].instructions[pc[d]];
      auto next = static_cast<size_t>(waiting.peer);
      if (const std::set<size_t> *arrived = arrived_at(d, waiting)) {
        // A collective or a bucket waits for the first member that has not
        // arrived (started it).
        next = P;
        for (int32_t member : groups[static_cast<size_t>(waiting.peer)])
          if (!arrived->contains(static_cast<size_t>(member))) {
            next = static_cast<size_t>(member);
            break;
          }
      }
      if (next >= P || pc[next] >= programs[next].instructions.size() || seen[next]) break;
      d = next;
    }
    first_stuck = d;
  }
  for (size_t d = first_stuck; d < P; ++d) {
    if (pc[d] == programs[d].instructions.size()) continue;
    const PlanInstruction &instr = programs[d].instructions[pc[d]];
    size_t stuck = 0;
    for (size_t e = 0; e < P; ++e)
      if (pc[e] < programs[e].instructions.size()) ++stuck;
    std::string head = str_cat("deadlock: device ", d, " instruction ", pc[d], " (",
                               describe_instruction(graph, instr), ") waits forever");
    if (const std::set<size_t> *arrived = arrived_at(d, instr)) {
      const bool bucket = instr.kind == InstrKind::kWaitBucket;
      for (int32_t member : groups[static_cast<size_t>(instr.peer)]) {
        const auto m = static_cast<size_t>(member);
        if (arrived->contains(m)) continue;
        return failed_precondition(
            head, ": device ", m, " of the group ",
            pc[m] < programs[m].instructions.size()
                ? str_cat("is blocked at instruction ", pc[m], " (",
                          describe_instruction(graph, programs[m].instructions[pc[m]]), ")",
                          bucket ? " without having started it" : "")
                : std::string(bucket ? "has finished without starting it"
                                     : "has finished without it"),
            " (", stuck, " devices stuck)");
      }
    }
    const auto peer = static_cast<size_t>(instr.peer);
    if (instr.peer < 0 || peer >= P)
      return failed_precondition(head, ": there is no device ", instr.peer);
    const auto &peer_instrs = programs[peer].instructions;
    std::optional<size_t> later_send;
    for (size_t i = pc[peer]; i < peer_instrs.size(); ++i) {
      const PlanInstruction &p = peer_instrs[i];
      if (p.kind == InstrKind::kSend && p.peer == static_cast<int>(d) && p.index == instr.index &&
          p.microbatch == instr.microbatch) {
        later_send = i;
        break;
      }
    }
    std::string peer_state = pc[peer] < peer_instrs.size()
                                 ? str_cat("is blocked at instruction ", pc[peer], " (",
                                           describe_instruction(graph, peer_instrs[pc[peer]]), ")")
                                 : std::string("has finished");
    if (later_send)
      return failed_precondition(head, ": device ", peer, " sends it only at instruction ",
                                 *later_send, " but ", peer_state, " (", stuck, " devices stuck)");
    return failed_precondition(head, ": device ", peer, " never sends it; device ", peer, " ",
                               peer_state, " (", stuck, " devices stuck)");
  }
  for (const auto &[key, queue] : channels) {
    if (queue.empty()) continue;
    const auto [src, dst, tag] = key;
    const size_t at = queue.front().second;
    return failed_precondition(
        "unmatched send: device ", src, " instruction ", at, " (",
        describe_instruction(graph, programs[static_cast<size_t>(src)].instructions[at]),
        ") is never received by device ", dst);
  }

  for (size_t d = 0; d < P; ++d) {
    sim.end[d] = clock[d];
    sim.step_time = std::max(sim.step_time, clock[d]);
  }
  double busy = 0;
  for (double b : sim.busy)
    busy += b;
  sim.bubble = sim.step_time > 0
                   ? std::clamp(1.0 - busy / (static_cast<double>(P) * sim.step_time), 0.0, 1.0)
                   : 0.0;
  return sim;
}

Status check_deadlock(const Graph &graph, const std::vector<PlanProgram> &programs,
                      const std::vector<std::vector<int32_t>> &groups) {
  return simulate_pipeline(graph, programs, zero_costs(), groups).status();
}

} // namespace strata::plan
