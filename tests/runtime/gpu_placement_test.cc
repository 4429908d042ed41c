// The CUDA backend's CPU-side bookkeeping, without a GPU: plan devices placed
// on GPUs (several on one), the transport of each group and link, --gpus
// parsing, and the capture record a CUDA Graph replay is checked against.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "partitioner/compile_pipeline.h"
#include "partitioner/lowering/pipeline.h"
#include "passes/fuse_elementwise.h"
#include "passes/make_training.h"
#include "plan/instructions.h"
#include "runtime/cuda/gpu_placement.h"
#include "tools/zoo.h"

namespace strata::runtime {
namespace {

void expect_error(const Status &status, std::initializer_list<std::string_view> parts) {
  ASSERT_FALSE(status.is_ok());
  for (std::string_view part : parts)
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "\"" << status.message() << "\" lacks \"" << part << "\"";
}

TEST(GpuPlacement, RoundRobinAndTransportPerGroup) {
  // A 2x2 mesh (dp x pp) on 2 GPUs: devices 0, 2 on GPU 0 and 1, 3 on GPU 1.
  // Group {0, 1} (a data-parallel pair) spans both GPUs: NCCL. Group {0, 2}
  // shares GPU 0: copies.
  auto placed = place_on_gpus(4, {{0, 1}, {0, 2}, {1, 3}, {0, 1, 2, 3}}, 2);
  ASSERT_TRUE(placed.is_ok()) << placed.status().message();
  EXPECT_EQ(placed->gpu_of_device, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(placed->group_transport,
            (std::vector<GpuTransport>{GpuTransport::kNccl, GpuTransport::kDeviceCopy,
                                       GpuTransport::kDeviceCopy, GpuTransport::kDeviceCopy}));
  EXPECT_EQ(placed->group_why[0], "every member on its own GPU");
  EXPECT_NE(placed->group_why[1].find("devices 0 and 2 share GPU 0"), std::string::npos)
      << placed->group_why[1];
  EXPECT_NE(placed->group_why[3].find("devices 0 and 2 share GPU 0"), std::string::npos)
      << placed->group_why[3];
  EXPECT_EQ(placed->link(0, 1), GpuTransport::kNccl);
  EXPECT_EQ(placed->link(1, 3), GpuTransport::kDeviceCopy);
  EXPECT_STREQ(gpu_transport_name(GpuTransport::kDeviceCopy), "device copies");

  // Every plan device on one GPU (a 4-stage pipeline for testing): all copies.
  auto one = place_on_gpus(4, {{0, 1, 2, 3}}, 1);
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(one->gpu_of_device, (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(one->group_transport[0], GpuTransport::kDeviceCopy);
  EXPECT_EQ(one->link(0, 3), GpuTransport::kDeviceCopy);

  // As many GPUs as devices: NCCL everywhere.
  auto eight = place_on_gpus(8, {{0, 1, 2, 3, 4, 5, 6, 7}}, 8);
  ASSERT_TRUE(eight.is_ok());
  EXPECT_EQ(eight->group_transport[0], GpuTransport::kNccl);
}

TEST(GpuPlacement, ExplicitListsAndErrors) {
  auto listed = place_on_gpus(4, {{0, 1}, {2, 3}}, 2, {0, 0, 1, 1});
  ASSERT_TRUE(listed.is_ok()) << listed.status().message();
  EXPECT_EQ(listed->group_transport,
            (std::vector<GpuTransport>{GpuTransport::kDeviceCopy, GpuTransport::kDeviceCopy}));
  EXPECT_EQ(listed->link(1, 2), GpuTransport::kNccl);

  expect_error(place_on_gpus(4, {}, 0).status(), {"no CUDA GPU", "4 device(s)"});
  expect_error(place_on_gpus(4, {}, 2, {0, 1}).status(), {"--gpus lists 2", "4 devices"});
  expect_error(place_on_gpus(2, {}, 2, {0, 2}).status(),
               {"plan device 1", "GPU 2", "shows 2 GPU(s)"});
  expect_error(place_on_gpus(2, {{0, 5}}, 2).status(), {"group 0", "device 5"});
  expect_error(place_on_gpus(0, {}, 1).status(), {"no devices"});
}

TEST(GpuPlacement, ParsesGpuLists) {
  auto parsed = parse_gpu_list("0,0,1,3");
  ASSERT_TRUE(parsed.is_ok());
  EXPECT_EQ(*parsed, (std::vector<int>{0, 0, 1, 3}));
  EXPECT_EQ(*parse_gpu_list("7"), std::vector<int>{7});
  for (const char *bad : {"", "0,", ",1", "0,x", "-1", "1.5", "0,,1"})
    expect_error(parse_gpu_list(bad).status(), {"--gpus", "is not a GPU index"});
  expect_error(parse_gpu_list("0,x").status(), {"entry 1", "'x'"});
}

TEST(CaptureRecord, ReplayNeedsTheCapturedBuffers) {
  float a[4], b[4], c[8];
  const TensorType f4{DType::kF32, {4}}, f8{DType::kF32, {8}}, f2x2{DType::kF32, {2, 2}};
  CaptureRecord captured;
  captured.add("x", a, f4);
  captured.add("w", b, f4);
  EXPECT_EQ(captured.size(), 2u);

  CaptureRecord same;
  same.add("x", a, f4);
  same.add("w", b, f4);
  EXPECT_TRUE(captured.check_replay(same).is_ok());

  CaptureRecord moved;
  moved.add("x", a, f4);
  moved.add("w", c, f4);
  expect_error(captured.check_replay(moved), {"'w' moved", "old memory"});

  CaptureRecord reshaped;
  reshaped.add("x", a, f2x2);
  reshaped.add("w", b, f4);
  expect_error(captured.check_replay(reshaped), {"'x' is f32[2, 2]", "was f32[4]"});

  CaptureRecord renamed;
  renamed.add("y", a, f4);
  renamed.add("w", b, f4);
  expect_error(captured.check_replay(renamed), {"buffer 0 is 'y'", "captured with 'x'"});

  CaptureRecord more = same;
  more.add("extra", c, f8);
  expect_error(captured.check_replay(more), {"binds 3 buffers", "captured with 2"});
}

// Plans for the launch order: a 4-stage 1F1B GPT and a 2x2 data-parallel
// pipeline with gradient buckets and one with blocking all-reduces.
std::vector<serialization::Plan> launch_plans() {
  zoo::GptOptions o;
  o.layers = 4;
  o.hidden = 16;
  o.heads = 2;
  o.seq = 8;
  o.vocab = 64;
  o.batch = 16;
  const Graph gpt = *zoo::make_gpt(o);
  passes::TrainingOptions training;
  training.optimizer = *passes::parse_optimizer("sgd:lr=0.1,momentum=0.9");
  std::vector<serialization::Plan> plans;
  partitioner::PipelineCompileOptions mesh;
  mesh.stages = 4;
  mesh.microbatches = 8;
  plans.push_back(*partitioner::compile_pipeline(gpt, training, mesh));
  mesh.stages = 2;
  mesh.microbatches = 2;
  mesh.data_parallel = 2;
  mesh.bucket_bytes = 4096;
  plans.push_back(*partitioner::compile_pipeline(gpt, training, mesh));
  mesh.bucket_bytes = 0;
  plans.push_back(*partitioner::compile_pipeline(gpt, training, mesh));
  mesh.data_parallel = 1;
  mesh.tensor_parallel = 2;
  plans.push_back(*partitioner::compile_pipeline(gpt, training, mesh));
  // Interleaved: two model chunks on each of 4 devices.
  mesh.tensor_parallel = 1;
  mesh.stages = 4;
  mesh.microbatches = 8;
  mesh.schedule = partitioner::Schedule::kInterleaved;
  mesh.chunks = 2;
  plans.push_back(*partitioner::compile_pipeline(gpt, training, mesh));
  // ... with two replicas of a 2-device pipeline and gradient buckets.
  mesh.stages = 2;
  mesh.microbatches = 2;
  mesh.data_parallel = 2;
  mesh.bucket_bytes = 4096;
  plans.push_back(*partitioner::compile_pipeline(gpt, training, mesh));
  // ... with tensor-parallel pairs at each of 2 positions instead.
  mesh.data_parallel = 1;
  mesh.bucket_bytes = 0;
  mesh.tensor_parallel = 2;
  plans.push_back(*partitioner::compile_pipeline(gpt, training, mesh));
  return plans;
}

// One thread can enqueue the launches in order: every instruction once, each
// device's in its program's order, every receive after the send it matches,
// and each collective once, on exactly its group's members in group order.
TEST(GpuLaunchOrder, KeepsEveryDevicesOrderAndEnqueuesNothingBeforeItsCause) {
  using serialization::InstrKind;
  for (const serialization::Plan &plan : launch_plans()) {
    SCOPED_TRACE(std::to_string(plan.programs.size()) + " devices");
    const auto &groups = plan.pipeline->groups;
    const int tp = plan.pipeline->tensor_parallel;
    auto order =
        gpu_launch_order(plan.graph, plan.programs, groups, tp, plan.pipeline->tp_groups_begin);
    ASSERT_TRUE(order.is_ok()) << order.status().message();
    std::vector<uint32_t> next(plan.programs.size(), 0);
    std::map<std::tuple<int, int, uint64_t>, int> unreceived;
    size_t collectives = 0, receives = 0, buckets = 0, tensor_parallel = 0;
    std::set<std::pair<int, uint32_t>> reduced; // (device, bucket)
    for (const GpuLaunch &launch : *order) {
      ASSERT_FALSE(launch.parts.empty());
      if (launch.reduce) {
        // A bucket's reduction: every member of its group, in group order,
        // each at a StartBucket already launched.
        ++buckets;
        const auto &first = plan.programs[static_cast<size_t>(launch.parts[0].device)]
                                .instructions[launch.parts[0].instruction];
        ASSERT_EQ(first.kind, InstrKind::kStartBucket);
        const auto &group = groups.at(static_cast<size_t>(first.peer));
        ASSERT_EQ(launch.parts.size(), group.size());
        for (size_t m = 0; m < group.size(); ++m) {
          const GpuLaunch::Part &part = launch.parts[m];
          EXPECT_EQ(part.device, group[m]);
          EXPECT_LT(part.instruction, next[static_cast<size_t>(part.device)])
              << "reduced before device " << part.device << " started the bucket";
          const auto &instr =
              plan.programs[static_cast<size_t>(part.device)].instructions[part.instruction];
          EXPECT_EQ(instr.kind, InstrKind::kStartBucket);
          EXPECT_EQ(instr.index, first.index);
          reduced.insert({part.device, instr.index});
        }
        continue;
      }
      for (const GpuLaunch::Part &part : launch.parts) {
        ASSERT_LT(static_cast<size_t>(part.device), plan.programs.size());
        EXPECT_EQ(part.instruction, next[static_cast<size_t>(part.device)]++)
            << "device " << part.device << " out of order";
      }
      const auto &first = plan.programs[static_cast<size_t>(launch.parts[0].device)]
                              .instructions[launch.parts[0].instruction];
      if (first.kind == InstrKind::kCompute && launch.parts.size() > 1) {
        // A tensor-parallel collective: the node on one micro-batch, on every
        // member of the device's group.
        ++tensor_parallel;
        const int d = launch.parts[0].device;
        const auto &group = groups.at(static_cast<size_t>(plan.pipeline->tp_groups_begin + d / tp));
        ASSERT_EQ(launch.parts.size(), group.size());
        for (size_t m = 0; m < group.size(); ++m) {
          EXPECT_EQ(launch.parts[m].device, group[m]);
          const auto &instr = plan.programs[static_cast<size_t>(group[m])]
                                  .instructions[launch.parts[m].instruction];
          EXPECT_EQ(instr.index, first.index);
          EXPECT_EQ(instr.microbatch, first.microbatch);
        }
        continue;
      }
      if (first.kind == InstrKind::kAllReduce) {
        ++collectives;
        const auto &group = groups.at(static_cast<size_t>(first.peer));
        ASSERT_EQ(launch.parts.size(), group.size());
        for (size_t m = 0; m < group.size(); ++m) {
          EXPECT_EQ(launch.parts[m].device, group[m]);
          const auto &instr = plan.programs[static_cast<size_t>(group[m])]
                                  .instructions[launch.parts[m].instruction];
          EXPECT_EQ(instr.kind, first.kind);
          EXPECT_EQ(instr.index, first.index);
          EXPECT_EQ(instr.peer, first.peer);
        }
        continue;
      }
      ASSERT_EQ(launch.parts.size(), 1u);
      const int d = launch.parts[0].device;
      if (first.kind == InstrKind::kSend)
        ++unreceived[{d, first.peer, plan::transfer_tag(first.index, first.microbatch)}];
      if (first.kind == InstrKind::kWaitBucket) {
        EXPECT_TRUE(reduced.contains({d, first.index}))
            << "device " << d << " waits for bucket " << first.index << " before its reduction";
      }
      if (first.kind == InstrKind::kRecv) {
        ++receives;
        int &sent =
            unreceived[{first.peer, d, plan::transfer_tag(first.index, first.microbatch)}];
        EXPECT_GT(sent, 0) << "device " << d << " receives before the send is enqueued";
        --sent;
      }
    }
    for (size_t d = 0; d < plan.programs.size(); ++d)
      EXPECT_EQ(next[d], plan.programs[d].instructions.size()) << "device " << d;
    EXPECT_GT(receives, 0u);
    if (plan.pipeline->data_parallel > 1) {
      EXPECT_GT(collectives + buckets, 0u);
    }
    if (tp > 1) {
      EXPECT_GT(tensor_parallel, 0u);
    }
    if (plan.pipeline->bucket_bytes > 0) {
      EXPECT_GT(buckets, 0u);
    }
  }
}

TEST(GpuLaunchOrder, AReceiveNeverSentNamesTheStuckDevices) {
  using serialization::InstrKind;
  serialization::Plan plan = launch_plans()[0];
  // Drop device 0's first send: device 1 waits for it forever.
  auto &instructions = plan.programs[0].instructions;
  auto send = std::find_if(instructions.begin(), instructions.end(),
                           [](const auto &instr) { return instr.kind == InstrKind::kSend; });
  ASSERT_NE(send, instructions.end());
  instructions.erase(send);
  auto order = gpu_launch_order(plan.graph, plan.programs, plan.pipeline->groups);
  ASSERT_FALSE(order.is_ok());
  expect_error(order.status(), {"cannot all proceed", "device 1 instruction", "recv"});

  // A collective on a device outside its group.
  serialization::Plan dp = launch_plans()[2];
  auto &program = dp.programs[0].instructions;
  auto reduce = std::find_if(program.begin(), program.end(),
                             [](const auto &instr) { return instr.kind == InstrKind::kAllReduce; });
  ASSERT_NE(reduce, program.end());
  for (size_t g = 0; g < dp.pipeline->groups.size(); ++g) {
    const auto &group = dp.pipeline->groups[g];
    if (std::find(group.begin(), group.end(), 0) == group.end()) {
      reduce->peer = static_cast<int32_t>(g);
      break;
    }
  }
  order = gpu_launch_order(dp.graph, dp.programs, dp.pipeline->groups);
  ASSERT_FALSE(order.is_ok());
  expect_error(order.status(), {"device 0 instruction", "not in group"});
}

// Over several GPUs every rank walks the same launch order and makes its
// NCCL calls at the same launches as its peers: a message's send and receive
// at the receive's launch, on the two ranks that hold its ends; a collective
// spread over GPUs on every rank with a member; the check flags' all-reduce
// at the step's first update on every rank. Every instruction of every
// device is run by exactly its own GPU's rank.
TEST(GpuRankSteps, EveryRankMeetsItsPeersAtTheSameLaunch) {
  using serialization::InstrKind;
  const std::vector<serialization::Plan> plans = launch_plans();
  struct Case {
    size_t plan;
    std::vector<int> gpus;
  };
  const std::vector<Case> cases = {
      {0, {0, 1, 2, 3}},                    // a 4-stage pipeline, a GPU per stage
      {0, {0, 0, 1, 1}},                    // two stages per GPU: one link crosses
      {1, {0, 1, 2, 3}},                    // pipeline x data parallel with buckets
      {1, {0, 1, 0, 1}}, {2, {0, 1, 2, 3}}, // ... with blocking all-reduces
      {3, {0, 1, 2, 3}},                    // pipeline x tensor parallel
      {3, {0, 1, 0, 1}}, {4, {0, 1, 2, 3}}, // interleaved, two chunks per device
      {4, {0, 0, 1, 1}},
      {6, {0, 1, 2, 3}}, // interleaved x tensor parallel: members over NCCL
      {6, {0, 0, 1, 1}}, // ... members sharing a GPU
  };
  for (const Case &c : cases) {
    const serialization::Plan &plan = plans[c.plan];
    SCOPED_TRACE(testing::Message() << "plan " << c.plan << " on GPUs " << c.gpus[0] << ","
                                    << c.gpus[1] << "," << c.gpus[2] << "," << c.gpus[3]);
    const auto &groups = plan.pipeline->groups;
    const int tp = plan.pipeline->tensor_parallel, tp_begin = plan.pipeline->tp_groups_begin;
    auto placed = place_on_gpus(static_cast<int>(plan.programs.size()), groups, 4, c.gpus);
    ASSERT_TRUE(placed.is_ok()) << placed.status().message();
    const GpuRanks ranks = gpu_ranks(*placed);
    auto order = gpu_launch_order(plan.graph, plan.programs, groups, tp, tp_begin);
    ASSERT_TRUE(order.is_ok()) << order.status().message();
    std::vector<std::vector<GpuRankStep>> steps;
    for (size_t r = 0; r < ranks.gpu.size(); ++r) {
      auto planned = gpu_rank_steps(plan.graph, plan.programs, groups, tp, tp_begin, *order,
                                    *placed, static_cast<int>(r));
      ASSERT_TRUE(planned.is_ok()) << planned.status().message();
      ASSERT_EQ(planned->size(), order->size());
      steps.push_back(std::move(planned).value());
    }
    auto rank_of = [&](int device) { return ranks.rank_of_device[static_cast<size_t>(device)]; };
    // (device, instruction) -> times run by its rank.
    std::map<std::pair<int, uint32_t>, int> ran;
    size_t messages = 0, crossing = 0, collectives = 0, shared = 0;
    for (size_t k = 0; k < order->size(); ++k) {
      const GpuLaunch &launch = (*order)[k];
      const auto &lead = plan.programs[static_cast<size_t>(launch.parts[0].device)]
                             .instructions[launch.parts[0].instruction];
      const bool is_recv = !launch.reduce && lead.kind == InstrKind::kRecv;
      messages += is_recv ? 1 : 0;
      const int group = gpu_launch_group(plan.graph, plan.programs, launch, tp, tp_begin);
      std::set<int> holders;
      for (const GpuLaunch::Part &part : launch.parts)
        holders.insert(rank_of(part.device));
      int senders = 0, receivers = 0;
      for (size_t r = 0; r < steps.size(); ++r) {
        const GpuRankStep &step = steps[r][k];
        EXPECT_EQ(step.share_flags, steps[0][k].share_flags) << "launch " << k;
        const bool holds = holders.contains(static_cast<int>(r));
        switch (step.action) {
        case GpuRankAction::kSkip:
          EXPECT_FALSE(holds) << "rank " << r << " skips its launch " << k;
          if (is_recv) {
            EXPECT_NE(rank_of(lead.peer), static_cast<int>(r)) << "a send left unsent at " << k;
          }
          break;
        case GpuRankAction::kLocal:
          EXPECT_TRUE(holds);
          if (is_recv) {
            EXPECT_EQ(rank_of(lead.peer), static_cast<int>(r)) << "both ends here at " << k;
          }
          if (group >= 0) {
            EXPECT_EQ(holders.size(), 1u) << "a collective over GPUs run locally at " << k;
          }
          for (const GpuLaunch::Part &part : launch.parts)
            if (!launch.reduce) ++ran[{part.device, part.instruction}];
          break;
        case GpuRankAction::kNcclRecv: {
          ++receivers;
          ASSERT_TRUE(is_recv);
          EXPECT_EQ(rank_of(launch.parts[0].device), static_cast<int>(r));
          EXPECT_EQ(rank_of(lead.peer), step.peer);
          EXPECT_NE(step.peer, static_cast<int>(r));
          ++ran[{step.part.device, step.part.instruction}];
          break;
        }
        case GpuRankAction::kNcclSend: {
          ++senders;
          ASSERT_TRUE(is_recv);
          // The part is the send this receive matches, on this rank.
          const auto &send = plan.programs[static_cast<size_t>(step.part.device)]
                                 .instructions[step.part.instruction];
          EXPECT_EQ(send.kind, InstrKind::kSend);
          EXPECT_EQ(rank_of(step.part.device), static_cast<int>(r));
          EXPECT_EQ(step.part.device, lead.peer);
          EXPECT_EQ(send.peer, launch.parts[0].device);
          EXPECT_EQ(send.index, lead.index);
          EXPECT_EQ(send.microbatch, lead.microbatch);
          EXPECT_EQ(step.peer, rank_of(launch.parts[0].device));
          break;
        }
        case GpuRankAction::kNcclCollective: {
          ++collectives;
          EXPECT_TRUE(holds);
          EXPECT_GT(holders.size(), 1u);
          EXPECT_EQ(step.group, group);
          EXPECT_EQ(rank_of(step.part.device), static_cast<int>(r));
          // One member per GPU: the part is this rank's only one.
          size_t mine = 0;
          for (const GpuLaunch::Part &part : launch.parts)
            if (rank_of(part.device) == static_cast<int>(r)) {
              ++mine;
              EXPECT_EQ(part.device, step.part.device);
              if (!launch.reduce) ++ran[{part.device, part.instruction}];
            }
          EXPECT_EQ(mine, 1u);
          break;
        }
        }
      }
      EXPECT_EQ(senders, receivers) << "launch " << k;
      EXPECT_LE(senders, 1);
      crossing += static_cast<size_t>(senders);
      if (steps[0][k].share_flags) {
        ++shared;
        EXPECT_EQ(lead.kind, InstrKind::kUpdate);
      }
    }
    for (size_t d = 0; d < plan.programs.size(); ++d)
      for (uint32_t i = 0; i < plan.programs[d].instructions.size(); ++i)
        EXPECT_EQ((ran[{static_cast<int>(d), i}]), 1)
            << "device " << d << " instruction " << i << " runs once";
    EXPECT_EQ(shared, 1u);
    // Which messages and collectives cross GPUs follows the placement.
    size_t expected_crossing = 0;
    for (size_t d = 0; d < plan.programs.size(); ++d)
      for (const auto &instr : plan.programs[d].instructions)
        if (instr.kind == InstrKind::kRecv && rank_of(instr.peer) != rank_of(static_cast<int>(d)))
          ++expected_crossing;
    EXPECT_EQ(crossing, expected_crossing);
    EXPECT_GE(messages, crossing);
    const bool spread = std::set<int>(c.gpus.begin(), c.gpus.end()).size() == 4;
    if (spread) {
      EXPECT_EQ(crossing, messages) << "a GPU per device: every message crosses";
    }
    const bool pipeline_only = groups.empty(); // plans 0 and 4
    if (pipeline_only && !spread) {
      EXPECT_GT(crossing, 0u);
      EXPECT_LT(crossing, messages);
    }
    if (!pipeline_only && spread) {
      EXPECT_GT(collectives, 0u);
    }
  }
}

// Processes as threads: gather to rank 0 and broadcast from it, each call
// collective (every rank makes it, in the same order).
class ThreadProcesses {
public:
  explicit ThreadProcesses(int size) : size_(size) {}
  class Member : public ProcessGroup {
  public:
    Member(ThreadProcesses *all, int rank) : all_(all), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return all_->size_; }
    Status gather(const std::string &mine, std::vector<std::string> *all,
                  std::string_view) override {
      std::unique_lock lock(all_->mutex_);
      const int64_t round = all_->round_;
      if (all_->slots_.empty()) all_->slots_.assign(static_cast<size_t>(all_->size_), "");
      all_->slots_[static_cast<size_t>(rank_)] = mine;
      if (++all_->arrived_ == all_->size_) {
        all_->gathered_ = std::move(all_->slots_);
        all_->slots_.clear();
        all_->arrived_ = 0;
        ++all_->round_;
        all_->changed_.notify_all();
      }
      all_->changed_.wait(lock, [&] { return all_->round_ != round; });
      if (rank_ == 0) *all = all_->gathered_;
      return Status::ok();
    }
    Status broadcast(std::string *data, std::string_view) override {
      std::unique_lock lock(all_->mutex_);
      const int64_t round = all_->round_;
      if (rank_ == 0) all_->sent_ = *data;
      if (++all_->arrived_ == all_->size_) {
        all_->arrived_ = 0;
        ++all_->round_;
        all_->changed_.notify_all();
      }
      all_->changed_.wait(lock, [&] { return all_->round_ != round; });
      *data = all_->sent_;
      return Status::ok();
    }

  private:
    ThreadProcesses *all_;
    int rank_;
  };
  // Runs body(rank's group) on a thread per rank.
  template <typename Body> void run(Body body) {
    std::vector<Member> members;
    for (int r = 0; r < size_; ++r)
      members.emplace_back(this, r);
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r)
      threads.emplace_back([&, r] { body(members[static_cast<size_t>(r)]); });
    for (std::thread &thread : threads)
      thread.join();
  }

private:
  int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  int64_t round_ = 0;
  std::vector<std::string> slots_, gathered_;
  std::string sent_;
};

// After a step across processes every process has every output, from the
// process keeping it, and the same verdict: the first real failure by rank
// (not a process that stopped because another failed).
TEST(StepResults, EveryProcessGetsEveryOutputAndTheFirstFailure) {
  const std::vector<TensorType> types = {{DType::kF32, {2}}, {DType::kI64, {}}};
  auto kept_by = [&](int rank) {
    std::vector<std::optional<HostTensor>> kept(2);
    if (rank == 1) {
      HostTensor loss = HostTensor::zeros(types[0]);
      reinterpret_cast<float *>(loss.data())[0] = 1.5f;
      reinterpret_cast<float *>(loss.data())[1] = -2.0f;
      kept[0] = std::move(loss);
    }
    if (rank == 2 || rank == 1) {
      HostTensor count = HostTensor::zeros(types[1]);
      *reinterpret_cast<int64_t *>(count.data()) = 40 + rank; // the first keeper's wins
      kept[1] = std::move(count);
    }
    return kept;
  };
  ThreadProcesses three(3);
  std::vector<Status> statuses(3, Status::ok());
  std::vector<std::vector<std::optional<HostTensor>>> results(3);
  three.run([&](ProcessGroup &group) {
    auto kept = kept_by(group.rank());
    statuses[static_cast<size_t>(group.rank())] =
        share_step_results(group, Status::ok(), types, &kept);
    results[static_cast<size_t>(group.rank())] = std::move(kept);
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(statuses[static_cast<size_t>(r)].is_ok())
        << statuses[static_cast<size_t>(r)].message();
    const auto &kept = results[static_cast<size_t>(r)];
    ASSERT_TRUE(kept[0] && kept[1]) << "rank " << r;
    EXPECT_EQ(reinterpret_cast<const float *>(kept[0]->data())[1], -2.0f);
    EXPECT_EQ(*reinterpret_cast<const int64_t *>(kept[1]->data()), 41) << "rank " << r;
  }

  // Rank 0 stopped because another failed; rank 2 failed for real.
  three.run([&](ProcessGroup &group) {
    auto kept = kept_by(group.rank());
    const Status mine = group.rank() == 2   ? out_of_range("label 11 of 10 classes")
                        : group.rank() == 0 ? failed_precondition("another GPU of the run failed")
                                            : Status::ok();
    statuses[static_cast<size_t>(group.rank())] = share_step_results(group, mine, types, &kept);
  });
  for (int r = 0; r < 3; ++r) {
    const Status &status = statuses[static_cast<size_t>(r)];
    ASSERT_FALSE(status.is_ok()) << "rank " << r;
    EXPECT_NE(status.message().find("label 11 of 10 classes"), std::string::npos)
        << "rank " << r << ": " << status.message();
  }
  EXPECT_EQ(statuses[2].code(), StatusCode::kOutOfRange); // its own error, as it was
  EXPECT_NE(statuses[1].message().find("process 2"), std::string::npos) << statuses[1].message();

  // Nobody keeps output 1.
  three.run([&](ProcessGroup &group) {
    std::vector<std::optional<HostTensor>> kept(2);
    statuses[static_cast<size_t>(group.rank())] =
        agree_across(group, Status::ok(), "start-up").is_ok()
            ? share_step_results(group, Status::ok(), types, &kept)
            : internal_error("agree failed");
  });
  for (const Status &status : statuses)
    EXPECT_NE(status.message().find("no process keeps output 0"), std::string::npos)
        << status.message();
}

// A device runs an elementwise chain as one kernel only where its nodes are
// back to back on one micro-batch and the chain's output slot is apart from
// everything the chain reads.
TEST(ProgramChains, ConsecutiveRunsWhoseOutputIsApartFromTheirOperands) {
  using serialization::InstrKind;
  for (const serialization::Plan &plan : launch_plans()) {
    SCOPED_TRACE(std::to_string(plan.programs.size()) + " devices");
    const Graph &g = plan.graph;
    const auto chains = passes::find_elementwise_chains(g, *g.topological_order());
    ASSERT_FALSE(chains.empty());
    size_t runs = 0;
    for (const serialization::PlanProgram &program : plan.programs) {
      std::map<std::pair<TensorId, int32_t>, int64_t> slot;
      for (const auto &s : program.slots)
        slot[{s.tensor, s.microbatch}] = s.offset;
      size_t after = 0;
      for (const ProgramChain &run : program_chains(g, program, chains)) {
        ++runs;
        EXPECT_GE(run.first, after) << "runs overlap or are out of order";
        after = run.last + 1;
        const auto &chain = chains.at(run.chain);
        ASSERT_EQ(run.last - run.first + 1, chain.size());
        const int32_t mb = program.instructions[run.first].microbatch;
        for (size_t j = 0; j < chain.size(); ++j) {
          const auto &instr = program.instructions[run.first + j];
          EXPECT_EQ(instr.kind, InstrKind::kCompute);
          EXPECT_EQ(instr.index, chain[j]);
          EXPECT_EQ(instr.microbatch, mb);
        }
        const TensorId out = g.node(chain.back()).outputs[0];
        const int64_t begin = slot.at({out, mb}), end = begin + g.tensor(out).type.size_bytes();
        for (NodeId id : chain)
          for (TensorId t : g.node(id).inputs) {
            auto in = slot.find({t, mb});
            if (in == slot.end() ||
                std::find(chain.begin(), chain.end(), g.tensor(t).producer) != chain.end())
              continue;
            EXPECT_TRUE(in->second + g.tensor(t).type.size_bytes() <= begin || end <= in->second)
                << "'" << g.tensor(t).name << "' shares bytes with the chain's output";
          }
      }
    }
    EXPECT_GT(runs, 0u);
  }
  // A chain broken by another instruction in between is not fused.
  serialization::Plan plan = launch_plans()[0];
  const Graph &g = plan.graph;
  const auto chains = passes::find_elementwise_chains(g, *g.topological_order());
  auto &program = plan.programs[0];
  const auto before = program_chains(g, program, chains);
  ASSERT_FALSE(before.empty());
  serialization::PlanInstruction between = program.instructions.back(); // not in a chain
  ASSERT_NE(between.kind, InstrKind::kCompute);
  program.instructions.insert(
      program.instructions.begin() + static_cast<std::ptrdiff_t>(before[0].first + 1), between);
  const auto after = program_chains(g, program, chains);
  EXPECT_EQ(after.size() + 1, before.size());
  // Nor is one whose intermediate another instruction names (a send of it).
  serialization::Plan sent = launch_plans()[0];
  auto &instructions = sent.programs[0].instructions;
  const auto runs = program_chains(g, sent.programs[0], chains);
  ASSERT_FALSE(runs.empty());
  serialization::PlanInstruction send;
  send.kind = InstrKind::kSend;
  send.index = g.node(chains[runs[0].chain].front()).outputs[0];
  send.microbatch = instructions[runs[0].first].microbatch;
  send.peer = 1;
  instructions.push_back(send);
  EXPECT_LT(program_chains(g, sent.programs[0], chains).size(), runs.size());
}

TEST(GpuRankSteps, AGroupPartlySharingAGpuIsRefused) {
  // Devices 0 and 1 share GPU 0, device 2 is on GPU 1: the group is neither
  // on one GPU nor one member per GPU.
  const std::vector<std::vector<int32_t>> groups = {{0, 1, 2}};
  auto placed = place_on_gpus(3, groups, 2, {0, 0, 1});
  ASSERT_TRUE(placed.is_ok());
  Graph graph("empty");
  std::vector<serialization::PlanProgram> programs(3);
  auto steps = gpu_rank_steps(graph, programs, groups, 1, -1, {}, *placed, 0);
  ASSERT_FALSE(steps.is_ok());
  expect_error(steps.status(), {"group 0 spans 2 GPUs", "devices 0 and 1 share GPU 0", "--gpus"});
  auto no_rank = gpu_rank_steps(graph, programs, {}, 1, -1, {}, *placed, 2);
  expect_error(no_rank.status(), {"rank 2", "2 GPU(s)"});
}

} // namespace
} // namespace strata::runtime
