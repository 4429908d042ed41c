// The `strata` command line: one binary, one subcommand per task.
//
// This file only registers the subcommands (each in its own
// tools/cmd_<name>.cc, declared in tools/cli.h) and turns failures into
// `strata: error: <cause>` on stderr with a non-zero exit status.
#include <csignal>
#include <iostream>
#include <new>
#include <optional>

#include <CLI/CLI.hpp>

#include "runtime/comm/mpi_world.h"
#include "tools/cli.h"

namespace strata::tools {
namespace {

constexpr int kExitFailure = 1; // the command ran and failed
constexpr int kExitUsage = 2;   // the command line itself is wrong

} // namespace
} // namespace strata::tools

int main(int argc, char **argv) {
  using namespace strata::tools;
  const auto launch = strata::runtime::detect_mpi_launch();
  CLI::App app("strata: a graph-compiled dataflow engine for distributed deep learning.\n"
               "Models are graphs of ops; strata builds, converts, inspects and runs them.",
               "strata");
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata " STRATA_VERSION);
  app.footer("Examples:\n"
             "  strata zoo gpt --layers 2 --batch 8 -o gpt.strata      # build a model\n"
             "  strata inspect gpt.strata                              # parameters, FLOPs\n"
             "  strata run gpt.strata --output logits.npy              # run it on the CPU\n"
             "  strata convert gpt.strata -o gpt.json                  # readable form\n"
             "  strata import resnet18.onnx -o resnet18.strata         # from ONNX (PyTorch)\n"
             "  strata compile gpt.strata --train --optimizer adamw:lr=1e-3 -o t.splan\n"
             "  strata run t.splan --steps 30                          # train it\n"
             "  strata compile gpt.strata --train --mesh 1x1x4 --microbatches 8 -o pp.splan\n"
             "  strata run pp.splan --steps 5 --trace t.json           # 4-stage pipeline\n"
             "  strata verify pp.splan                                 # trains as one device?\n"
             "  strata run pp.splan --steps 5 --checkpoint ck          # save as it trains\n"
             "  strata reshard ck --plan dp.splan -o ck_dp             # for another mesh\n"
             "  strata export ck -o model.safetensors                  # weights for PyTorch\n\n"
             "Run `strata <command> --help` for a command's options.");

  Action action;
  add_zoo(app, action);
  add_convert(app, action);
  add_import(app, action);
  add_inspect(app, action);
  add_compile(app, action);
  add_run(app, action);
  add_simulate(app, action);
  add_verify(app, action);
  add_ops(app, action);
  add_calibrate(app, action);
  add_export(app, action);
  add_reshard(app, action);

  if (auto unknown = unknown_command(app, argc, argv)) {
    std::cerr << "strata: error: " << *unknown << "\n";
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::optional<std::string> unknown;
    if (dynamic_cast<const CLI::ExtrasError *>(&e) != nullptr)
      unknown = unknown_option(app, argc, argv);
    std::cerr << "strata: error: " << (unknown ? *unknown : one_line(e.what())) << " (see `"
              << command_path(app) << " --help`)\n";
    return kExitUsage;
  }
  if (!action) {
    std::cerr << "strata: error: no command given (see `strata --help`)\n";
    return kExitUsage;
  }
  strata::Status status = strata::Status::ok();
  try {
    status = action();
  } catch (const std::bad_alloc &) {
    // Whatever a model or plan asked for beyond the checks of its sizes.
    status =
        strata::failed_precondition("out of memory: this host cannot allocate what the run needs");
  }
  if (!status.is_ok()) {
    std::cout.flush();
    if (!strata::runtime::claim_failure_report()) return kExitFailure;
    // One write: under mpirun, several ranks' messages share one terminal.
    std::cerr << strata::str_cat(
                     "strata: error: ",
                     launch && launch->size > 1 ? strata::str_cat("rank ", launch->rank, ": ") : "",
                     one_line(status.message()), "\n")
              << std::flush;
    if (int signal_number = training_stop_signal(); signal_number != 0) {
      // End by the signal itself, so that a calling shell stops too (a loop
      // over runs ends at Ctrl-C); 128 + it should that return.
      std::signal(signal_number, SIG_DFL);
      std::raise(signal_number);
      return 128 + signal_number;
    }
    return kExitFailure;
  }
  return 0;
}
