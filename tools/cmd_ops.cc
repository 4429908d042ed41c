// `strata ops`: the ops strata knows, with their summaries, inputs,
// attributes and backends.
#include <algorithm>
#include <iostream>

#include "ops/registry.h"
#include "runtime/cuda/cuda_executor.h"
#include "tools/cli.h"

namespace strata::tools {

void add_ops(CLI::App &app, Action &action) {
  static bool verbose = false;
  static std::string backend;
  CLI::App *sub = app.add_subcommand("ops", "List the ops strata knows, with their summaries");
  sub->add_flag("-v,--verbose", verbose, "also list each op's inputs, attributes and backends");
  sub->add_option("--backend", backend, "only the ops this backend runs (cpu or cuda)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->footer("Examples:\n  strata ops\n  strata ops --verbose\n  strata ops --backend cuda");
  sub->callback([&action] {
    action = [] {
      const auto &registry = ops::OpRegistry::global();
      const std::vector<std::string_view> cuda_ops = runtime::cuda_backend_ops();
      auto on_cuda = [&](const ops::OpDef *def) {
        // Ops without inputs (Constant) are computed once at load on any backend.
        return std::binary_search(cuda_ops.begin(), cuda_ops.end(), def->name) ||
               (def->max_inputs == 0 && def->cpu_kernel != nullptr);
      };
      auto listed = [&](const ops::OpDef *def) {
        if (backend == "cuda") return on_cuda(def);
        if (backend == "cpu") return def->cpu_kernel != nullptr;
        return true;
      };
      size_t width = 0;
      for (const ops::OpDef *def : registry.all())
        width = std::max(width, def->name.size());
      if (backend == "cuda" && cuda_ops.empty())
        std::cout << "(none: " << runtime::cuda_unavailable_reason() << ")\n";
      for (const ops::OpDef *def : registry.all()) {
        if (!listed(def)) continue;
        std::string name(def->name);
        std::cout << name << std::string(width + 2 - name.size(), ' ') << def->summary << '\n';
        if (!verbose) continue;
        std::string indent(width + 2, ' ');
        if (def->min_inputs == def->max_inputs)
          std::cout << indent << "inputs: " << def->min_inputs << '\n';
        else
          std::cout << indent << "inputs: " << def->min_inputs << " to " << def->max_inputs << '\n';
        for (const ops::AttrSpec &attr : def->attrs) {
          std::cout << indent << "  " << attr.name << ": " << attr_type_name(attr.type);
          if (attr.default_value)
            std::cout << " = " << attr_value_to_string(*attr.default_value);
          else
            std::cout << " (required)";
          if (!attr.doc.empty()) std::cout << " -- " << attr.doc;
          std::cout << '\n';
        }
        std::cout << indent << "backends: " << (def->cpu_kernel ? "cpu" : "")
                  << (def->cpu_kernel && on_cuda(def) ? ", " : "") << (on_cuda(def) ? "cuda" : "")
                  << '\n';
      }
      if (registry.all().empty()) std::cout << "(no ops registered)\n";
      return Status::ok();
    };
  });
}

} // namespace strata::tools
