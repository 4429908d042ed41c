// Training on the CPU: the training graph of a small MLP runs and learns, and
// a run stopped and resumed from its checkpoint matches one that never stopped,
// bitwise.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "graph/verifier.h"
#include "ops/registry.h"
#include "passes/make_training.h"
#include "plan/checkpoint_layout.h"
#include "runtime/cpu/executor.h"
#include "runtime/trainer.h"
#include "serialization/checkpoint.h"
#include "serialization/model_io.h"
#include "serialization/npy.h"
#include "serialization/safetensors.h"
#include "tools/zoo.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;

class TrainerTest : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           str_cat("strata_trainer_", ::getpid(), "_",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string &name) const { return (dir_ / name).string(); }

  static Graph training_graph(const std::string &loss = "softmax_cross_entropy",
                              const std::string &optimizer = "adamw:lr=0.01,wd=0.1") {
    zoo::MlpOptions mlp;
    mlp.batch = 8;
    mlp.input = 12;
    mlp.hidden = {16};
    mlp.classes = 4;
    passes::TrainingOptions options;
    options.loss = loss;
    options.optimizer = *passes::parse_optimizer(optimizer);
    auto graph = passes::make_training_graph(*zoo::make_mlp(mlp), options);
    EXPECT_TRUE(graph.is_ok()) << graph.status().message();
    return std::move(graph).value();
  }

  std::unique_ptr<Trainer> trainer(const std::string &optimizer = "adamw:lr=0.01,wd=0.1") {
    Graph graph = training_graph("softmax_cross_entropy", optimizer);
    Dataset data = synthetic_dataset(graph, 5);
    TrainerOptions options;
    options.fingerprint = "plan-fingerprint";
    auto created = Trainer::create(std::move(graph), "loss", std::move(data), options);
    EXPECT_TRUE(created.is_ok()) << created.status().message();
    return std::move(created).value();
  }

  fs::path dir_;
};

TEST_F(TrainerTest, TrainingGraphShape) {
  Graph graph = training_graph();
  EXPECT_TRUE(verify_graph(graph, ops::OpRegistry::global()).is_ok());
  ASSERT_EQ(graph.outputs().size(), 1u);
  EXPECT_EQ(graph.tensor(graph.outputs()[0]).name, "loss");
  auto labels = graph.find_tensor("labels");
  ASSERT_TRUE(labels);
  EXPECT_EQ(graph.tensor(*labels).type.to_string(), "i64[8]");
  EXPECT_FALSE(graph.updates().empty());

  Graph mse = training_graph("mse", "sgd:lr=0.1");
  auto targets = mse.find_tensor("targets");
  ASSERT_TRUE(targets);
  EXPECT_EQ(mse.tensor(*targets).type.to_string(), "f32[8, 4]");
}

TEST_F(TrainerTest, OptionErrorsNameTheOptionAndModel) {
  auto forward = zoo::make_mlp({});
  passes::TrainingOptions options;
  options.loss = "hinge";
  auto bad_loss = passes::make_training_graph(*forward, options);
  ASSERT_FALSE(bad_loss.is_ok());
  EXPECT_NE(bad_loss.status().message().find("--loss 'hinge'"), std::string::npos);
  EXPECT_NE(bad_loss.status().message().find("mlp"), std::string::npos);
  options.loss = "mse";
  options.output = "nothing";
  auto bad_output = passes::make_training_graph(*forward, options);
  ASSERT_FALSE(bad_output.is_ok());
  EXPECT_NE(bad_output.status().message().find("--loss-input 'nothing'"), std::string::npos);
}

TEST_F(TrainerTest, LossFallsOnTheSyntheticTask) {
  auto t = trainer();
  double first = 0, last = 0;
  for (int i = 0; i < 40; ++i) {
    auto loss = t->train_step();
    ASSERT_TRUE(loss.is_ok()) << loss.status().message();
    if (i < 8) first += *loss / 8;
    if (i >= 32) last += *loss / 8;
  }
  EXPECT_EQ(t->step(), 40);
  EXPECT_LT(last, first * 0.8) << "first epoch " << first << ", last epoch " << last;
}

// Steps given their batches compute what steps that read the same batches
// from the trainer's data do; a trainer without data needs them, and a batch
// of the wrong type is refused naming the input.
TEST_F(TrainerTest, StepsGivenTheirBatchesMatchStepsOnTheData) {
  auto own = trainer();
  Graph graph = training_graph();
  const Dataset data = synthetic_dataset(graph, 5);
  TrainerOptions options;
  options.fingerprint = "plan-fingerprint";
  auto given = Trainer::create(std::move(graph), "loss", Dataset{}, options);
  ASSERT_TRUE(given.is_ok()) << given.status().message();
  auto none = (*given)->train_step();
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("no batches"), std::string::npos);
  for (size_t k = 0; k < 3; ++k) {
    auto a = own->train_step();
    auto b = (*given)->train_step(data.batches[k]);
    ASSERT_TRUE(a.is_ok() && b.is_ok()) << b.status().message();
    EXPECT_EQ(*a, *b) << "step " << k + 1;
  }
  EXPECT_EQ((*given)->step(), 3);

  std::vector<HostTensor> wrong = data.batches[0];
  wrong[1] = HostTensor::zeros({DType::kI64, {4}});
  auto refused = (*given)->train_step(wrong);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("input 'labels' is i64[4]"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ((*given)->step(), 3);
}

TEST_F(TrainerTest, ResumeIsBitwiseEqualToAnUninterruptedRun) {
  auto straight = trainer();
  for (int i = 0; i < 6; ++i)
    ASSERT_TRUE(straight->train_step().is_ok());

  auto first = trainer();
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(first->train_step().is_ok());
  ASSERT_TRUE(first->save_checkpoint(path("ck")).is_ok());
  auto second = trainer();
  Status restored = second->restore_checkpoint(path("ck"));
  ASSERT_TRUE(restored.is_ok()) << restored.message();
  EXPECT_EQ(second->step(), 3);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(second->train_step().is_ok());

  auto a = straight->state(), b = second->state();
  ASSERT_EQ(a.size(), b.size());
  for (const auto &[name, value] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    ASSERT_EQ(value.size_bytes(), b.at(name).size_bytes());
    EXPECT_EQ(std::memcmp(value.data(), b.at(name).data(), value.size_bytes()), 0) << name;
  }
  EXPECT_EQ(a.at("optimizer.step").as<int64_t>()[0], 6);
}

TEST_F(TrainerTest, CheckpointMismatchesAreRefusedNamingFileAndTensor) {
  auto t = trainer();
  ASSERT_TRUE(t->train_step().is_ok());
  ASSERT_TRUE(t->save_checkpoint(path("ck")).is_ok());

  // Another plan's checkpoint.
  TrainerOptions other;
  other.fingerprint = "another-plan";
  Graph graph = training_graph();
  auto stranger = *Trainer::create(graph, "loss", synthetic_dataset(graph, 0), other);
  Status refused = stranger->restore_checkpoint(path("ck"));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("fingerprint"), std::string::npos);

  // A checkpoint without one tensor (its manifest rewritten to match).
  auto state = t->state();
  state.erase(state.begin()->first == "optimizer.step" ? std::next(state.begin())->first
                                                       : state.begin()->first);
  std::string dropped;
  for (const auto &[name, value] : t->state())
    if (!state.count(name)) dropped = name;
  ASSERT_TRUE(
      serialization::write_checkpoint(path("partial"), state, "plan-fingerprint", 1).is_ok());
  auto fresh = trainer();
  Status missing = fresh->restore_checkpoint(path("partial"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.message().find("manifest.json"), std::string::npos) << missing.message();
  EXPECT_NE(missing.message().find("in none of the checkpoint's files"), std::string::npos)
      << missing.message();
  EXPECT_NE(missing.message().find("'" + dropped + "'"), std::string::npos) << missing.message();

  // A tensor of the wrong type.
  auto wrong = t->state();
  wrong.at(dropped) = HostTensor::zeros({DType::kF32, {1}});
  ASSERT_TRUE(serialization::write_checkpoint(path("wrong"), wrong, "plan-fingerprint", 1).is_ok());
  Status mistyped = fresh->restore_checkpoint(path("wrong"));
  ASSERT_FALSE(mistyped.is_ok());
  EXPECT_NE(mistyped.message().find("'" + dropped + "'"), std::string::npos) << mistyped.message();

  // Corrupted bytes.
  std::string weights;
  for (const auto &entry : std::filesystem::directory_iterator(path("ck")))
    if (entry.path().extension() == ".safetensors") weights = entry.path().string();
  ASSERT_FALSE(weights.empty());
  {
    std::fstream file(weights, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    file.put('\x55');
  }
  Status corrupt = fresh->restore_checkpoint(path("ck"));
  ASSERT_FALSE(corrupt.is_ok());
  EXPECT_NE(corrupt.message().find(std::filesystem::path(weights).filename().string()),
            std::string::npos)
      << corrupt.message();
}

// A CPU executor whose reads fail once `broken` is set, as a GPU's would.
class UnreadableRunner : public StepRunner {
public:
  explicit UnreadableRunner(std::unique_ptr<StepRunner> inner) : inner_(std::move(inner)) {}
  const Graph &graph() const override { return inner_->graph(); }
  Status run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) override {
    return inner_->run(inputs, outputs);
  }
  const HostTensor &value(TensorId id) const override { return inner_->value(id); }
  Status assign(TensorId id, const HostTensor &value) override { return inner_->assign(id, value); }
  Status read_status() const override {
    return broken ? internal_error("CUDA copying to the host: an illegal memory access")
                  : Status::ok();
  }
  bool broken = false;

private:
  std::unique_ptr<StepRunner> inner_;
};

// Weights that could not be read are not checkpointed: the previous
// checkpoint stays the one the manifest names.
// A checkpoint that records its model and optimizer resumes a plan of
// another fingerprint with the same ones, and says which layout wrote it;
// another model or optimizer is refused, naming what differs.
TEST_F(TrainerTest, ACheckpointResumesAnotherPlanOfTheSameModelAndOptimizer) {
  auto with = [&](std::string fingerprint, std::string model, std::string optimizer) {
    TrainerOptions options;
    options.fingerprint = std::move(fingerprint);
    Graph graph = training_graph();
    options.layout = plan::checkpoint_layout(graph, std::move(model), std::move(optimizer),
                                             "layout of " + options.fingerprint);
    return *Trainer::create(graph, "loss", synthetic_dataset(graph, 0), options);
  };
  auto writer = with("plan-a", "model-1", "sgd:lr=0.1");
  ASSERT_TRUE(writer->train_step().is_ok());
  ASSERT_TRUE(writer->train_step().is_ok());
  ASSERT_TRUE(writer->save_checkpoint(path("ck")).is_ok());
  auto read = serialization::read_checkpoint(path("ck"), "");
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  EXPECT_EQ(read->layout.model, "model-1");
  EXPECT_EQ(read->layout.description, "layout of plan-a");

  auto same = with("plan-b", "model-1", "sgd:lr=0.1");
  Status resumed = same->restore_checkpoint(path("ck"));
  ASSERT_TRUE(resumed.is_ok()) << resumed.message();
  EXPECT_EQ(same->step(), 2);
  EXPECT_EQ(same->resharded_from(), "layout of plan-a");
  const std::map<std::string, HostTensor> resumed_state = same->state();
  for (const auto &[name, value] : writer->state()) {
    const HostTensor &got = resumed_state.at(name);
    ASSERT_EQ(got.size_bytes(), value.size_bytes()) << name;
    EXPECT_EQ(std::memcmp(got.data(), value.data(), value.size_bytes()), 0) << name;
  }
  // The plan that wrote it is not a reshard.
  auto itself = with("plan-a", "model-1", "sgd:lr=0.1");
  ASSERT_TRUE(itself->restore_checkpoint(path("ck")).is_ok());
  EXPECT_EQ(itself->resharded_from(), "");

  Status other_model = with("plan-c", "model-2", "sgd:lr=0.1")->restore_checkpoint(path("ck"));
  EXPECT_NE(other_model.message().find("another model"), std::string::npos)
      << other_model.message();
  Status other_optimizer =
      with("plan-d", "model-1", "adam:lr=0.001")->restore_checkpoint(path("ck"));
  EXPECT_NE(other_optimizer.message().find("'sgd:lr=0.1'"), std::string::npos)
      << other_optimizer.message();
  EXPECT_NE(other_optimizer.message().find("'adam:lr=0.001'"), std::string::npos)
      << other_optimizer.message();
}

TEST_F(TrainerTest, AnUnreadableRunnerCommitsNoCheckpoint) {
  Graph graph = training_graph();
  Dataset data = synthetic_dataset(graph, 5);
  auto cpu = CpuExecutor::create(graph);
  ASSERT_TRUE(cpu.is_ok());
  auto runner = std::make_unique<UnreadableRunner>(std::move(cpu).value());
  UnreadableRunner *unreadable = runner.get();
  TrainerOptions options;
  options.fingerprint = "plan-fingerprint";
  auto t = Trainer::create(std::move(runner), "loss", std::move(data), options);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  ASSERT_TRUE((*t)->train_step().is_ok());
  ASSERT_TRUE((*t)->save_checkpoint(path("ck")).is_ok());
  ASSERT_TRUE((*t)->train_step().is_ok());
  unreadable->broken = true;
  Status saved = (*t)->save_checkpoint(path("ck"));
  ASSERT_FALSE(saved.is_ok());
  EXPECT_NE(saved.message().find("illegal memory access"), std::string::npos) << saved.message();
  EXPECT_NE(saved.message().find("checkpoint " + path("ck") + " at step 2 was not saved"),
            std::string::npos)
      << saved.message();
  auto reloaded = trainer();
  ASSERT_TRUE(reloaded->restore_checkpoint(path("ck")).is_ok());
  EXPECT_EQ(reloaded->step(), 1);
}

TEST_F(TrainerTest, DataFolderBatchesAreReadInOrder) {
  Graph graph = training_graph();
  // Two batches: the synthetic batches 0 and 1, stacked.
  Dataset synthetic = synthetic_dataset(graph, 11, 2);
  for (size_t i = 0; i < graph.inputs().size(); ++i) {
    const Tensor &input = graph.tensor(graph.inputs()[i]);
    TensorType stacked = input.type;
    stacked.shape.insert(stacked.shape.begin(), 2);
    HostTensor both = HostTensor::zeros(stacked);
    size_t bytes = static_cast<size_t>(input.type.size_bytes());
    std::memcpy(both.data(), synthetic.batches[0][i].data(), bytes);
    std::memcpy(both.data() + bytes, synthetic.batches[1][i].data(), bytes);
    ASSERT_TRUE(serialization::write_npy(path(input.name + ".npy"), both).is_ok());
  }
  auto data = load_dataset(graph, dir_.string());
  ASSERT_TRUE(data.is_ok()) << data.status().message();
  ASSERT_EQ(data->batches.size(), 2u);
  for (size_t k = 0; k < 2; ++k)
    for (size_t i = 0; i < graph.inputs().size(); ++i)
      EXPECT_EQ(std::memcmp(data->batches[k][i].data(), synthetic.batches[k][i].data(),
                            synthetic.batches[k][i].size_bytes()),
                0);

  fs::remove(path("labels.npy"));
  auto missing = load_dataset(graph, dir_.string());
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("labels.npy"), std::string::npos);
}

} // namespace
} // namespace strata::runtime

namespace strata::runtime {
namespace {

// A model file that loads must run or fail with an error: never crash, read
// or write out of bounds, or overflow (the sanitizer build runs this too, on
// every 32nd byte). Every byte of a small GPT's AdamW training graph (forward,
// backward, clipping and the optimizer) is flipped in turn; each model that
// still loads (a flip in a weight, a learning rate or a name) runs one step on
// the CPU.
TEST(CorruptModels, ThoseThatLoadRunOrFailCleanly) {
  zoo::GptOptions o;
  o.layers = 1;
  o.hidden = 8;
  o.heads = 2;
  o.seq = 4;
  o.vocab = 16;
  o.batch = 2;
  passes::TrainingOptions options;
  options.optimizer = *passes::parse_optimizer("adamw:lr=0.01,clip=1");
  auto graph = passes::make_training_graph(*zoo::make_gpt(o), options);
  ASSERT_TRUE(graph.is_ok()) << graph.status().message();
  auto bytes = serialization::model_to_flatbuffer(*graph);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
#if defined(__SANITIZE_ADDRESS__)
  constexpr size_t kStride = 32;
#else
  constexpr size_t kStride = 1;
#endif
  size_t flips = 0, loaded = 0, ran = 0;
  for (size_t i = 0; i < bytes->size(); i += kStride, ++flips) {
    std::vector<uint8_t> flipped = *bytes;
    flipped[i] ^= 0xff;
    auto model = serialization::load_model_from_buffer(flipped, "m.strata", ".");
    if (!model.is_ok()) {
      EXPECT_NE(model.status().message().find("m.strata"), std::string::npos) << i;
      continue;
    }
    ++loaded;
    auto inputs = random_inputs(*model, 1);
    auto executor = CpuExecutor::create(std::move(*model));
    if (!executor.is_ok()) continue;
    std::vector<HostTensor> outputs;
    if ((*executor)->run(inputs, &outputs).is_ok()) ++ran;
  }
  std::printf("%zu of %zu bytes flipped: %zu load, %zu run a step\n", flips, bytes->size(), loaded,
              ran);
  EXPECT_LT(loaded, flips); // the structure and meaning checks refuse some
  EXPECT_GT(ran, 0u);
}

} // namespace
} // namespace strata::runtime
