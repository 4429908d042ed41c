// `strata reshard`: a checkpoint rewritten for another plan of the same model
// and optimizer (another mesh, schedule, ZeRO stage or number of processes).
// The pieces the old layout wrote are joined by its layout record
// (plan/checkpoint_layout.h), checked against the new plan's tensors, and
// saved whole as one process's checkpoint of the new plan, which `strata run
// NEW --resume DIR` continues at the same step.
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <system_error>

#include "plan/checkpoint_layout.h"
#include "serialization/checkpoint.h"
#include "serialization/file_io.h"
#include "tools/cli.h"
#include "tools/plan_text.h"
#include "tools/training_setup.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using serialization::Plan;

struct ReshardArgs {
  std::string checkpoint;
  std::string plan;
  std::string output;
};

// The output folder, before anything is read: one this process may write
// into, holding no checkpoint (reshard writes a new one, it never replaces).
Status check_output_folder(const ReshardArgs &args) {
  std::error_code error;
  if (holds_checkpoint(args.output))
    return failed_precondition("-o ", args.output,
                               " already holds a checkpoint, which reshard would replace",
                               fs::equivalent(args.output, args.checkpoint, error)
                                   ? " (it is the checkpoint being resharded)"
                                   : "",
                               "; give a new or empty folder");
  return serialization::check_folder_writable(args.output, "-o");
}

// "4 tensors (2 parameters, 2 optimizer state)".
std::string tensor_summary(const serialization::CheckpointLayout &layout) {
  int64_t parameters = 0;
  for (const auto &entry : layout.tensors)
    parameters += entry.second.parameter ? 1 : 0;
  const int64_t state = static_cast<int64_t>(layout.tensors.size()) - parameters;
  return str_cat(counted(static_cast<int64_t>(layout.tensors.size()), "tensor"), " (",
                 counted(parameters, "parameter"), ", ", state, " optimizer state)");
}

Status reshard_command(const ReshardArgs &args, std::ostream &out) {
  ASSIGN_OR_RETURN(Plan plan, load_plan_file(args.plan));
  if (plan.mode != Plan::Mode::kTrain)
    return invalid_argument("--plan ", args.plan,
                            " is an inference plan; a checkpoint is resharded for a training "
                            "plan (strata compile --train)");
  RETURN_IF_ERROR(check_output_folder(args));
  ASSIGN_OR_RETURN(serialization::Checkpoint checkpoint,
                   serialization::read_checkpoint(args.checkpoint, ""));
  const serialization::CheckpointLayout mine =
      plan::checkpoint_layout(plan, plan::layout_description(plan, 1));
  const std::string manifest =
      (fs::path(args.checkpoint) / serialization::kCheckpointManifestFile).string();
  RETURN_IF_ERROR(plan::check_resumable(checkpoint, plan.fingerprint, mine, manifest));
  // A checkpoint without a layout record passed only as this plan's own: its
  // pieces are where this plan puts them.
  const std::string from = checkpoint.layout.empty()
                               ? str_cat(args.plan, "'s own (the checkpoint records none)")
                               : checkpoint.layout.description;
  RETURN_IF_ERROR(plan::join_checkpoint(
      checkpoint, checkpoint.layout.empty() ? mine : checkpoint.layout, args.checkpoint));
  const serialization::CheckpointLayout whole = plan::without_cuts(mine);
  RETURN_IF_ERROR(plan::check_checkpoint_tensors(checkpoint, whole, args.checkpoint));

  // Only now is the folder made, and locked against a run saving into it.
  ASSIGN_OR_RETURN(std::optional<serialization::CheckpointLock> lock,
                   claim_checkpoint_folder(args.output, "", 0, "-o", "strata run --resume"));
  RETURN_IF_ERROR(serialization::write_checkpoint(args.output, checkpoint.tensors, plan.fingerprint,
                                                  checkpoint.step, whole));
  out << "checkpoint " << args.checkpoint << ": step " << checkpoint.step << ", written as " << from
      << "\n";
  out << "plan       " << args.plan << ": " << whole.description << "\n";
  out << "wrote      " << args.output << ": step " << checkpoint.step << ", "
      << tensor_summary(whole) << ", every tensor whole\n";
  out << "continue   strata run " << args.plan << " --resume " << args.output << "\n";
  return Status::ok();
}

constexpr char kReshardFooter[] =
    "Rewrites a checkpoint for another training plan of the same model and\n"
    "optimizer: another mesh (DPxTPxPP), schedule, number of micro-batches, ZeRO\n"
    "stage or number of processes. The checkpoint's pieces (ZeRO-1 shards,\n"
    "tensor-parallel cuts, a file per rank) are joined by the layout record of its\n"
    "manifest, checked against PLAN's parameters and optimizer state, and written\n"
    "whole into DIR as one process's checkpoint of PLAN at the same step; `strata\n"
    "run PLAN --resume DIR` continues from there, on one process or under mpirun.\n\n"
    "A plan of another model or optimizer (another optimizer string: its kind or\n"
    "hyperparameters) is refused, naming what differs; so is a DIR that already\n"
    "holds a checkpoint. A checkpoint from before manifest format 3 (no layout\n"
    "record) is resharded only by the plan that wrote it.\n\n"
    "Examples:\n"
    "  strata compile m.strata --train --mesh 1x1x4 --microbatches 8 -o pp.splan\n"
    "  strata run pp.splan --steps 100 --checkpoint ck\n"
    "  strata compile m.strata --train --mesh 2x1x2 --microbatches 4 -o dp.splan\n"
    "  strata reshard ck --plan dp.splan -o ck_dp\n"
    "  strata run dp.splan --steps 200 --resume ck_dp --checkpoint ck_dp";

} // namespace

void add_reshard(CLI::App &app, Action &action) {
  static ReshardArgs args;
  CLI::App *sub = app.add_subcommand(
      "reshard", "Rewrite a checkpoint for another plan of the same model and optimizer");
  sub->add_option("CKPT", args.checkpoint, "checkpoint folder (strata run --checkpoint)")
      ->required()
      ->check(not_empty_path("a checkpoint folder"))
      ->type_name("DIR");
  sub->add_option("--plan", args.plan, "the training plan to resume with (.splan, .splan.json)")
      ->required()
      ->check(not_empty_path("a plan file"))
      ->type_name("PLAN");
  sub->add_option("-o,--output", args.output, "folder to write the new checkpoint into")
      ->required()
      ->check(not_empty_path("a folder"))
      ->type_name("DIR");
  sub->footer(kReshardFooter);
  sub->callback([&action] { action = [] { return reshard_command(args, std::cout); }; });
}

} // namespace strata::tools
