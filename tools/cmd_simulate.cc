// `strata simulate`: a pipeline plan's step time and bubble predicted for a
// cluster, by replaying every device's program against the others.
#include <iostream>

#include "partitioner/compile_pipeline.h"
#include "partitioner/cost/cluster.h"
#include "plan/trace.h"
#include "serialization/file_io.h"
#include "serialization/plan_io.h"
#include "tools/cli.h"
#include "tools/plan_text.h"

namespace strata::tools {
namespace {

struct SimulateArgs {
  std::string plan;
  std::string cluster; // spec file; empty: the one the plan was compiled for
  std::string trace;   // write the predicted schedule as a Chrome trace here
};

Status simulate_command(const SimulateArgs &args, std::ostream &out) {
  ASSIGN_OR_RETURN(serialization::Plan plan, load_plan_file(args.plan));
  if (!plan.pipeline)
    return invalid_argument(args.plan, ": not a pipeline plan (compile it with --mesh 1x1xP)");
  partitioner::ClusterSpec cluster;
  if (args.cluster.empty()) {
    ASSIGN_OR_RETURN(cluster, partitioner::parse_cluster(plan.pipeline->cluster_json, args.plan));
  } else {
    ASSIGN_OR_RETURN(cluster, partitioner::load_cluster(args.cluster));
  }
  auto sim = partitioner::simulate_plan(plan, cluster);
  if (!sim.is_ok()) return sim.status().with_context(args.plan);
  const serialization::PlanPipeline &p = *plan.pipeline;
  out << "plan       " << args.plan << " (" << counted(p.stages, "stage") << " x "
      << counted(p.microbatches, "micro-batch") << ", " << p.schedule
      << (p.chunks > 1 ? str_cat(", ", p.chunks, " chunks per device") : "") << ")\n";
  out << "cluster    " << cluster.name << (args.cluster.empty() ? " (the plan's own)" : "") << "\n";
  out << "step       " << format_ms(sim->step_time) << " predicted (the plan says "
      << format_ms(p.predicted_step_s) << ")\n";
  out << "bubble     " << format_percent(sim->bubble) << " (" << bubble_formula(p) << ")\n";
  out << "device         busy          idle\n";
  for (size_t d = 0; d < sim->busy.size(); ++d)
    out << pad(std::to_string(d), 6) << pad(format_ms(sim->busy[d]), 14)
        << pad(format_ms(sim->step_time - sim->busy[d]), 14) << "\n";
  if (!args.trace.empty()) {
    RETURN_IF_ERROR(serialization::write_file_atomically(
        args.trace,
        plan::chrome_trace(plan.graph, plan.programs, simulation_spans(*sim), p.microbatches, &p)));
    out << "trace      " << args.trace << " (predicted; open in ui.perfetto.dev)\n";
  }
  return Status::ok();
}

} // namespace

void add_simulate(CLI::App &app, Action &action) {
  static SimulateArgs args;
  CLI::App *sub = app.add_subcommand(
      "simulate", "Predict a pipeline plan's step time and bubble on another cluster");
  sub->add_option("PLAN", args.plan, "pipeline plan (.splan, .splan.json)")->required();
  sub->add_option("--cluster", args.cluster,
                  "cluster spec JSON (default: the one the plan was compiled for)")
      ->type_name("FILE");
  sub->add_option("--trace", args.trace, "write the predicted schedule as a Chrome trace")
      ->check(not_empty_path("a trace file"))
      ->type_name("FILE");
  sub->footer("Every device's program is replayed against the others: computation takes its\n"
              "roofline time on the cluster's device, a transfer the link's latency plus\n"
              "bytes / bandwidth, and a receive waits for its send. The stages stay as\n"
              "compiled; recompile to rebalance them for the new cluster.\n\n"
              "Examples:\n"
              "  strata simulate pp.splan --cluster examples/clusters/h100-8x-nvlink.json\n"
              "  strata simulate pp.splan --trace predicted.json");
  sub->callback([&action] { action = [] { return simulate_command(args, std::cout); }; });
}

} // namespace strata::tools
