// What "auto" resolves to on a NodeContext (auto_policy.hpp, copy_choice.hpp): tuning rules,
// the copy threshold and cache size, and read-outs for the tuner, bench and tests.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "context_class.hpp"
#include "zcoll/cma.hpp"
#include "zcoll/exchange.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

// The tuned collective named `name`.
op_code tuned_op(const std::string& name) {
  const auto op = parse_name<op_code>(name);
  if (!op || tuned_index(*op) == no_rules)
    throw std::invalid_argument("op must be one of " + tuned_names(", ") + ", got '" + name + "'");
  return *op;
}

// The call named `name` (the engine says whether it has a pull threshold of its own).
op_code named_op(const std::string& name) {
  const auto op = parse_name<op_code>(name);
  if (!op) throw std::invalid_argument("zcoll: no call named '" + name + "'");
  return *op;
}

// One tuning rule as Python passes it: (min_block, max_block or None, order code, copy code,
// fixed hybrid threshold or None).
using rule_tuple =
    std::tuple<std::size_t, std::optional<std::size_t>, int, int, std::optional<std::size_t>>;

void set_tuning_rules(node_context& ctx, const std::string& op,
                      const std::vector<rule_tuple>& rules) {
  std::vector<order_rule> orders;
  std::vector<copy_rule> copies;
  for (const auto& [min_block, max_block, order, copy, threshold] : rules) {
    block_range range{min_block, max_block.value_or(block_range{}.max_block)};
    orders.push_back({range, order});
    copies.push_back({range, copy, threshold.value_or(0), threshold.has_value()});
  }
  ctx.set_tuning_rules(tuned_op(op), std::move(orders), std::move(copies));
}

// The tuning table's rules and what order='auto' makes of them.
void def_tuning_rules(context_class& cls) {
  cls.def("set_tuning_rules", &set_tuning_rules, py::arg("op"), py::arg("rules"),
          "Tuning-table rules of op: (min_block, max_block or None, order code, copy code, "
          "fixed threshold or None) each; replaces earlier ones. Local: same on every node rank.");
  cls.def(
      "auto_order",
      [](const node_context& ctx, const std::string& op, std::size_t block, std::size_t received) {
        const auto_choice c = ctx.policy().resolve(tuned_op(op), block, received);
        return py::make_tuple(std::string(c.eager ? eager_name : name_of(c.order)), c.from_rule);
      },
      py::arg("op"), py::arg("block_bytes"), py::arg("received_bytes"),
      "(order or 'eager', decided by a tuning rule) of order='auto' for such a call.");
  cls.def(
      "auto_copy_plan",
      [](node_context& ctx, std::size_t block, std::size_t received, const std::string& op) {
        auto& policy = ctx.policy();
        const copy_plan p =
            policy.copy().peek(block, policy.touched_bytes(received), tuned_index(tuned_op(op)));
        return py::make_tuple(std::string(name_of(p.mode)), p.threshold);
      },
      py::arg("block_bytes"), py::arg("received_bytes"), py::arg("op") = "alltoall",
      "(mode, threshold) copy='auto' uses now for op's blocks of this size, each rank "
      "receiving received_bytes.");
  cls.def_property_readonly(
      "numa_domains", [](node_context& ctx) { return ctx.policy().numa_domains(); },
      "How many NUMA nodes this node's ranks span (1: unknown or one).");
}

// Online tuning (online_tuner.hpp): on or off, and what it settled on.
void def_online_tuning(context_class& cls) {
  cls.def(
      "set_online", [](node_context& ctx, bool on) { ctx.policy().online().enable(on); },
      py::arg("on"),
      "Local, the same on every node rank: order='auto' calls of sizes no rule covers try "
      "every order first (on), or not; either way every trial and choice is forgotten.");
  cls.def_property_readonly(
      "online_tuning", [](const node_context& ctx) { return ctx.policy().online().enabled(); },
      "Whether online tuning is on.");
  cls.def(
      "online_choice",
      [](const node_context& ctx, const std::string& op, std::size_t received) {
        return ctx.policy().online().choice(tuned_op(op), received);
      },
      py::arg("op"), py::arg("received_bytes"),
      "The order code online tuning settled on for op's calls receiving received_bytes per "
      "rank (AUTO_ORDER: the rules decide; EAGER_ORDER: the eager path), or None while still "
      "trying or for a size not seen.");
}

// What copy='auto' uses: the hybrid threshold, the cache bound, the eager path.
void def_copy_policy(context_class& cls) {
  cls.def(
      "set_copy_threshold",
      [](node_context& ctx, std::size_t bytes) { ctx.policy().copy().set_threshold(bytes); },
      py::arg("nbytes"), "Initial hybrid-copy threshold of copy='auto' (forgets tuning).");
  cls.def(
      "set_copy_cache",
      [](node_context& ctx, std::size_t bytes) { ctx.policy().copy().set_cache_bytes(bytes); },
      py::arg("nbytes"), "copy='auto' keeps calls moving at most this much on the node temporal.");
  cls.def_property_readonly("copy_cache",
                            [](node_context& ctx) { return ctx.policy().copy().cache_bytes(); });
  cls.def(
      "copy_threshold",
      [](node_context& ctx, std::size_t block) { return ctx.policy().copy().threshold_for(block); },
      py::arg("block_bytes"),
      "The hybrid threshold copy='auto' uses (or is trying) for blocks of this size.");
  cls.def_property_readonly("eager_bytes", &node_context::eager_bytes,
                            "Largest per-rank receive size of the eager path (0: none).");
}

// From what size private buffers are pulled by CMA (or take the slots).
void def_cma_policy(context_class& cls) {
  cls.def_property(
      "cma_bytes",
      [](const node_context& ctx) -> std::optional<std::size_t> {
        if (!ctx.policy().cma_forced()) return std::nullopt;
        return ctx.policy().cma_bytes();
      },
      [](node_context& ctx, std::optional<std::size_t> bytes) {
        if (bytes)
          ctx.policy().set_cma_bytes(*bytes);
        else
          ctx.policy().reset_cma_bytes();
      },
      "Fewest bytes per rank an exchange receives to pull private buffers by CMA (larger than "
      "any: never), or None where it is not forced: the built-in threshold "
      "(default_cma_bytes), bcast and the reductions pulling from the tuning table's "
      "thresholds. Forced, bcast and the reductions pull from their defaults scaled by its ratio "
      "to default_cma_bytes, whatever the table says. The same on every rank.");
  cls.def(
      "set_pull_bytes",
      [](node_context& ctx, const std::string& op, std::optional<std::size_t> bytes) {
        ctx.policy().set_pull_bytes(named_op(op), bytes);
      },
      py::arg("op"), py::arg("nbytes"),
      "Local (same on every node rank): the tuning table's threshold of op (bcast, allreduce, "
      "reduce, reduce_scatter): calls of at least nbytes per rank pull private buffers; None: "
      "the built-in rule.");
  cls.def(
      "pull_threshold",
      [](const node_context& ctx, const std::string& op) {
        return ctx.policy().pull_threshold(named_op(op));
      },
      py::arg("op"), "Fewest bytes per rank from which an op call pulls private buffers.");
  cls.def_property(
      "cma_push_bytes", [](const node_context& ctx) { return ctx.policy().cma_push_bytes(); },
      [](node_context& ctx, std::size_t bytes) { ctx.policy().set_cma_push_bytes(bytes); },
      "Fewest bytes a sender of a pulled irregular exchange pushes into a receiver holding more "
      "than its share (larger than any: never). The same on every rank.");
  cls.def_property(
      "private_slots", [](const node_context& ctx) { return ctx.policy().private_slots(); },
      [](node_context& ctx, bool yes) { ctx.policy().set_private_slots(yes); },
      "Whether private buffers beyond the eager size may take the eager slots (up to the CMA "
      "size). The same on every rank.");
}

// Whether the kernel lets the node's ranks read each other's memory, and what they read.
void def_cma_state(context_class& cls) {
  cls.def_property_readonly(
      "cma",
      [](const node_context& ctx) {
        const cross_memory& c = ctx.cma();
        using state = cross_memory::state;
        const char* s = c.current() == state::works     ? "works"
                        : c.current() == state::refused ? "refused"
                                                        : "untested";
        return py::make_tuple(std::string(s), c.refusal());
      },
      "(state, why refused): whether the node's ranks read each other's memory by CMA "
      "(probed before the first pull).");
  cls.def_property_readonly(
      "cma_moves", [](const node_context& ctx) { return ctx.cma().moves(); },
      "How many CMA reads and writes this rank's calls have made (which path a call took).");
  cls.def(
      "probe_cma",
      [](node_context& ctx, bool publish_unmapped) {
        py::gil_scoped_release release;
        return ctx.probe_cma(publish_unmapped);
      },
      py::arg("publish_unmapped") = false,
      "Collective: whether the node's ranks read each other's memory (and map each other's "
      "shared heap), probed now. publish_unmapped (tests): this rank's peers fail to read it, "
      "as under a refusing kernel.");
}

// The built-in defaults, and what the kernel allows.
void register_policy_defaults(py::module_& m) {
  m.attr("default_cma_bytes") = default_cma_bytes;
  m.attr("default_cma_push_bytes") = default_cma_push_bytes;
  m.def(
      "builtin_pull_bytes", [](const std::string& op) { return builtin_pull_bytes(named_op(op)); },
      py::arg("op"),
      "Fewest bytes per rank from which an op call (bcast, allreduce, reduce, reduce_scatter) "
      "pulls private buffers without a tuning table or a forced CMA threshold.");
  m.attr("cold_array_bytes") = cold_array_bytes;
  m.attr("ONLINE_RUNS") = online_tuner::runs;
  m.def("cma_kernel_status", &cma_kernel_status,
        "What the kernel allows this process: 'available', or why CMA is not.");
  m.def(
      "default_order",
      [](int p, std::size_t block_bytes, int numa_domains) {
        return static_cast<int>(default_order(p, block_bytes, numa_domains));
      },
      py::arg("p"), py::arg("block_bytes"), py::arg("numa_domains") = 1,
      "Order code used for order='auto' on p ranks spanning numa_domains NUMA nodes.");
  m.def("cold_transfer_runs", &cold_transfer_runs, py::arg("bytes_per_rank"),
        "Runs of a global transpose on a communicator without a context that go through MPI "
        "first (auto_policy.hpp): the ski-rental rule.");
  m.def("cold_plan_runs", &cold_plan_runs, py::arg("bytes_per_rank"),
        "Calls of a plan of several transposes (a PFFT), each moving bytes_per_rank[i], whose "
        "transposes go through MPI first while their communicators have no context.");
}

}  // namespace

void register_tuning(py::module_& m) {
  context_class cls = bound_context(m);
  def_tuning_rules(cls);
  def_online_tuning(cls);
  def_copy_policy(cls);
  def_cma_policy(cls);
  def_cma_state(cls);
  register_policy_defaults(m);
}

}  // namespace zcoll::bind
