// The optimizer pass: parsing and printing OptimizerSpec, and appending one
// training step (see optimizer.h).
//
// What append_optimizer adds, by name:
//  - state "optimizer.step" (i64 scalar) and nodes "optimizer.one" (an i64
//    Constant 1) and "optimizer.next_step" (Add), its new value;
//  - node "optimizer.lr": LearningRate of the step (the count before this run),
//    so the first run uses step 0; a warm-up gives base_lr * (step + 1) / warmup;
//  - with clipping, node "optimizer.clip_scale" (GlobalNormScale of all
//    gradients) and "<param>.clipped_grad" = gradient * scale per parameter;
//  - per parameter, state "<param>.momentum" (SGD with momentum) or
//    "<param>.adam_m" and "<param>.adam_v" (Adam, AdamW), and node
//    "<param>.update" (SgdUpdate or AdamUpdate; SgdUpdate gets the step so its
//    first momentum buffer is the gradient itself, as in PyTorch);
//  - state updates in gradient order: each parameter, then its states; the step
//    counter last. The graph's outputs are not changed.
#include "passes/optimizer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "graph/builder.h"
#include "ops/registry.h"

namespace strata::passes {
namespace {

using Kind = OptimizerSpec::Kind;

std::string_view kind_name(Kind kind) {
  switch (kind) {
  case Kind::kSgd: return "sgd";
  case Kind::kAdam: return "adam";
  case Kind::kAdamW: return "adamw";
  }
  return "?";
}

// The keys each optimizer accepts, in canonical (to_string) order.
std::vector<std::string_view> keys_of(Kind kind) {
  if (kind == Kind::kSgd)
    return {"lr", "momentum", "nesterov", "wd", "warmup", "schedule", "total", "min_lr", "clip"};
  return {"lr", "wd", "beta1", "beta2", "eps", "warmup", "schedule", "total", "min_lr", "clip"};
}

std::string join(const std::vector<std::string_view> &items) {
  std::string out;
  for (std::string_view item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// The shortest text that reads back as exactly `value`.
std::string format_double(double value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return ec == std::errc() ? std::string(buffer, end) : std::to_string(value);
}

std::optional<double> parse_double(std::string_view text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
    return std::nullopt;
  return value;
}

std::optional<int64_t> parse_int(std::string_view text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// Range checks shared by parse_optimizer and append_optimizer.
Status validate(const OptimizerSpec &spec) {
  const std::string_view name = kind_name(spec.kind);
  auto bad = [&](auto &&...parts) {
    return invalid_argument("optimizer '", name, "': ", parts...);
  };
  // A finite value of at least 0 (NaN fails the comparison).
  auto non_negative = [](double value) { return value >= 0 && std::isfinite(value); };
  if (!(spec.lr > 0) || !std::isfinite(spec.lr))
    return bad("lr must be positive, got ", format_double(spec.lr));
  if (!non_negative(spec.momentum))
    return bad("momentum must be >= 0, got ", format_double(spec.momentum));
  if (spec.nesterov && spec.momentum <= 0) return bad("nesterov needs momentum > 0");
  if (spec.kind != Kind::kSgd && (spec.momentum != 0 || spec.nesterov))
    return bad("momentum and nesterov apply only to sgd");
  if (!non_negative(spec.weight_decay))
    return bad("wd must be >= 0, got ", format_double(spec.weight_decay));
  if (!(spec.beta1 >= 0 && spec.beta1 < 1))
    return bad("beta1 must be in [0, 1), got ", format_double(spec.beta1));
  if (!(spec.beta2 >= 0 && spec.beta2 < 1))
    return bad("beta2 must be in [0, 1), got ", format_double(spec.beta2));
  // Adam divides by sqrt(v) + eps, and v is 0 until a gradient reaches it.
  if (!(spec.epsilon > 0) || !std::isfinite(spec.epsilon))
    return bad("eps must be positive, got ", format_double(spec.epsilon));
  if (spec.warmup_steps < 0) return bad("warmup must be >= 0, got ", spec.warmup_steps);
  if (spec.total_steps < 0) return bad("total must be >= 0, got ", spec.total_steps);
  if (spec.schedule == OptimizerSpec::Schedule::kCosine && spec.total_steps <= spec.warmup_steps)
    return bad("schedule=cosine needs total (", spec.total_steps, ") > warmup (", spec.warmup_steps,
               ")");
  if (!non_negative(spec.min_lr))
    return bad("min_lr must be >= 0, got ", format_double(spec.min_lr));
  // The schedule decays from lr down to min_lr.
  if (spec.min_lr > spec.lr)
    return bad("min_lr must be at most lr, got min_lr=", format_double(spec.min_lr),
               " and lr=", format_double(spec.lr));
  if (!non_negative(spec.clip_norm))
    return bad("clip must be >= 0, got ", format_double(spec.clip_norm));
  return Status::ok();
}

Status set_key(OptimizerSpec &spec, std::string_view key, std::string_view value) {
  const std::string_view name = kind_name(spec.kind);
  auto bad_value = [&](std::string_view expected) {
    return invalid_argument("optimizer '", name, "': ", key, "='", value, "' is not ", expected);
  };
  auto real = [&](double &out) -> Status {
    std::optional<double> v = parse_double(value);
    if (!v) return bad_value("a number");
    out = *v;
    return Status::ok();
  };
  auto integer = [&](int64_t &out) -> Status {
    std::optional<int64_t> v = parse_int(value);
    if (!v) return bad_value("an integer");
    out = *v;
    return Status::ok();
  };
  if (key == "lr") return real(spec.lr);
  if (key == "momentum") return real(spec.momentum);
  if (key == "wd") return real(spec.weight_decay);
  if (key == "beta1") return real(spec.beta1);
  if (key == "beta2") return real(spec.beta2);
  if (key == "eps") return real(spec.epsilon);
  if (key == "min_lr") return real(spec.min_lr);
  if (key == "clip") return real(spec.clip_norm);
  if (key == "warmup") return integer(spec.warmup_steps);
  if (key == "total") return integer(spec.total_steps);
  if (key == "nesterov") {
    if (value != "0" && value != "1") return bad_value("0 or 1");
    spec.nesterov = value == "1";
    return Status::ok();
  }
  if (key == "schedule") {
    if (value == "constant")
      spec.schedule = OptimizerSpec::Schedule::kConstant;
    else if (value == "cosine")
      spec.schedule = OptimizerSpec::Schedule::kCosine;
    else
      return bad_value("a schedule (constant, cosine)");
    return Status::ok();
  }
  return internal_error("optimizer key '", key, "' has no setter");
}

} // namespace

std::string OptimizerSpec::to_string() const {
  std::string out(kind_name(kind));
  char separator = ':';
  for (std::string_view key : keys_of(kind)) {
    std::string value;
    if (key == "lr") value = format_double(lr);
    if (key == "momentum") value = format_double(momentum);
    if (key == "nesterov") value = nesterov ? "1" : "0";
    if (key == "wd") value = format_double(weight_decay);
    if (key == "beta1") value = format_double(beta1);
    if (key == "beta2") value = format_double(beta2);
    if (key == "eps") value = format_double(epsilon);
    if (key == "warmup") value = std::to_string(warmup_steps);
    if (key == "schedule") value = schedule == Schedule::kCosine ? "cosine" : "constant";
    if (key == "total") value = std::to_string(total_steps);
    if (key == "min_lr") value = format_double(min_lr);
    if (key == "clip") value = format_double(clip_norm);
    out += separator;
    out += key;
    out += '=';
    out += value;
    separator = ',';
  }
  return out;
}

Result<OptimizerSpec> parse_optimizer(std::string_view text) {
  const size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  OptimizerSpec spec;
  if (name == "sgd")
    spec.kind = Kind::kSgd;
  else if (name == "adam")
    spec.kind = Kind::kAdam;
  else if (name == "adamw") {
    spec.kind = Kind::kAdamW;
    spec.weight_decay = 0.01; // torch.optim.AdamW's default, as its users expect
  } else
    return invalid_argument("unknown optimizer '", name, "' (expected sgd, adam or adamw)");
  const std::vector<std::string_view> keys = keys_of(spec.kind);
  std::vector<std::string_view> seen;
  std::string_view rest = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  if (colon != std::string_view::npos && rest.empty())
    return invalid_argument("optimizer '", name, "': nothing after ':'");
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty())
      return invalid_argument("optimizer '", name, "': trailing ',' after '", item, "'");
    const size_t equals = item.find('=');
    if (equals == std::string_view::npos)
      return invalid_argument("optimizer '", name, "': '", item, "' is not key=value");
    const std::string_view key = item.substr(0, equals);
    const std::string_view value = item.substr(equals + 1);
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      return invalid_argument("optimizer '", name, "': unknown key '", key, "' (keys: ", join(keys),
                              ")");
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      return invalid_argument("optimizer '", name, "': key '", key, "' is given twice");
    seen.push_back(key);
    RETURN_IF_ERROR(set_key(spec, key, value));
  }
  RETURN_IF_ERROR(validate(spec));
  return spec;
}

Status append_optimizer(Graph &graph, llvm::ArrayRef<Gradient> gradients,
                        const OptimizerSpec &spec) {
  RETURN_IF_ERROR(validate(spec));
  const std::string_view name = kind_name(spec.kind);
  if (gradients.empty()) return invalid_argument("optimizer '", name, "': no gradients to apply");
  if (graph.find_tensor("optimizer.step"))
    return already_exists("the graph already has an optimizer (tensor 'optimizer.step')");

  // Check the gradients against the graph before touching anything.
  std::vector<bool> is_target(graph.num_tensors(), false);
  for (const Gradient &g : gradients) {
    if (g.target >= graph.num_tensors() || g.gradient >= graph.num_tensors())
      return out_of_range("gradient refers to a tensor index past the graph's ",
                          graph.num_tensors(), " tensors");
    const Tensor &target = graph.tensor(g.target);
    const Tensor &gradient = graph.tensor(g.gradient);
    if (target.kind != TensorKind::kParameter)
      return invalid_argument("cannot optimize '", target.name, "': it is a ",
                              tensor_kind_name(target.kind), ", not a parameter");
    if (!is_floating(target.type.dtype))
      return invalid_argument("cannot optimize '", target.name, "': its dtype ",
                              dtype_name(target.type.dtype), " is not floating point");
    if (!(gradient.type == target.type))
      return invalid_argument("gradient '", gradient.name, "' (", gradient.type.to_string(),
                              ") does not match parameter '", target.name, "' (",
                              target.type.to_string(), ")");
    if (is_target[g.target])
      return invalid_argument("parameter '", target.name, "' has two gradients");
    is_target[g.target] = true;
  }
  for (const StateUpdate &update : graph.updates())
    if (update.target < is_target.size() && is_target[update.target])
      return invalid_argument("parameter '", graph.tensor(update.target).name,
                              "' already has a state update");

  // Everything below works on a copy; `graph` changes only on success.
  Graph work = graph;
  auto add_state = [&](std::string state_name, TensorType type) -> Result<TensorId> {
    Tensor tensor;
    tensor.name = std::move(state_name);
    tensor.type = std::move(type);
    tensor.kind = TensorKind::kState;
    tensor.initializer.kind = Initializer::Kind::kZeros;
    return work.add_tensor(std::move(tensor));
  };
  ASSIGN_OR_RETURN(const TensorId step, add_state("optimizer.step", TensorType{DType::kI64, {}}));

  const bool adam = spec.kind != Kind::kSgd;
  const bool momentum = spec.kind == Kind::kSgd && spec.momentum != 0;
  struct ParamState {
    TensorId first = kInvalidTensor;  // SGD momentum buffer or Adam m
    TensorId second = kInvalidTensor; // Adam v
  };
  std::vector<ParamState> states(gradients.size());
  for (size_t i = 0; i < gradients.size(); ++i) {
    const Tensor &param = work.tensor(gradients[i].target);
    const std::string param_name = param.name;
    const TensorType type = param.type;
    if (momentum) {
      ASSIGN_OR_RETURN(states[i].first, add_state(param_name + ".momentum", type));
    } else if (adam) {
      ASSIGN_OR_RETURN(states[i].first, add_state(param_name + ".adam_m", type));
      ASSIGN_OR_RETURN(states[i].second, add_state(param_name + ".adam_v", type));
    }
  }

  GraphBuilder b(std::move(work), ops::OpRegistry::global());
  const TensorId one = b.op1("Constant", {},
                             {{"dtype", std::string("i64")},
                              {"shape", std::vector<int64_t>{}},
                              {"value", std::vector<double>{1.0}}},
                             "optimizer.one");
  const TensorId next_step = b.op1("Add", {step, one}, {}, "optimizer.next_step");

  std::vector<Attribute> lr_attrs = {
      {"base_lr", spec.lr},
      {"schedule",
       std::string(spec.schedule == OptimizerSpec::Schedule::kCosine ? "cosine" : "constant")},
      {"warmup_steps", spec.warmup_steps}};
  if (spec.schedule == OptimizerSpec::Schedule::kCosine) {
    lr_attrs.push_back({"total_steps", spec.total_steps});
    lr_attrs.push_back({"min_lr", spec.min_lr});
  }
  const TensorId lr = b.op1("LearningRate", {step}, std::move(lr_attrs), "optimizer.lr");

  std::vector<TensorId> grads;
  for (const Gradient &g : gradients)
    grads.push_back(g.gradient);
  if (spec.clip_norm > 0) {
    const TensorId scale =
        b.op1("GlobalNormScale", grads, {{"max_norm", spec.clip_norm}}, "optimizer.clip_scale");
    for (size_t i = 0; i < grads.size(); ++i)
      grads[i] = b.op1("Mul", {grads[i], scale}, {},
                       str_cat(b.name(gradients[i].target), ".clipped_grad"));
  }

  struct Pending {
    TensorId target;
    TensorId value;
  };
  std::vector<Pending> updates;
  for (size_t i = 0; i < gradients.size(); ++i) {
    const TensorId param = gradients[i].target;
    const std::string node_name = str_cat(b.name(param), ".update");
    if (adam) {
      auto out = b.op("AdamUpdate", {param, grads[i], states[i].first, states[i].second, lr, step},
                      {{"beta1", spec.beta1},
                       {"beta2", spec.beta2},
                       {"epsilon", spec.epsilon},
                       {"weight_decay", spec.weight_decay},
                       {"decoupled", int64_t{spec.kind == Kind::kAdamW ? 1 : 0}}},
                      node_name);
      if (out.size() != 3) break; // the builder holds the error
      updates.push_back({param, out[0]});
      updates.push_back({states[i].first, out[1]});
      updates.push_back({states[i].second, out[2]});
    } else {
      std::vector<Attribute> attrs = {{"weight_decay", spec.weight_decay}};
      llvm::SmallVector<TensorId, 5> inputs = {param, grads[i], lr};
      if (momentum) {
        attrs.push_back({"momentum", spec.momentum});
        attrs.push_back({"nesterov", int64_t{spec.nesterov ? 1 : 0}});
        inputs.push_back(states[i].first);
        inputs.push_back(step);
      }
      auto out = b.op("SgdUpdate", inputs, std::move(attrs), node_name);
      if (out.size() != (momentum ? 2u : 1u)) break;
      updates.push_back({param, out[0]});
      if (momentum) updates.push_back({states[i].first, out[1]});
    }
  }
  ASSIGN_OR_RETURN(Graph result, std::move(b).finish());
  for (const Pending &u : updates)
    result.add_update({u.target, u.value});
  result.add_update({step, next_step});
  graph = std::move(result);
  return Status::ok();
}

bool is_step_op(std::string_view op) {
  const ops::OpDef *def = ops::OpRegistry::global().find(op);
  return def != nullptr && def->once_per_step;
}

} // namespace strata::passes
