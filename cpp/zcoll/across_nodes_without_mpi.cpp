// across_nodes.cpp for a build without MPI (CMakeLists.txt: ZCOLL_WITH_MPI off, or no MPI
// found): the same entries, each throwing. Such a build never registers a communicator spanning
// several nodes (Python raises when one is first used, naming both MPI libraries), so these are
// reached only by calling the extension's methods directly; they exist so that the binding is
// one text whichever way it is built.
#include <stdexcept>
#include <string>

#include "zcoll/across_nodes.hpp"

namespace zcoll {

namespace {

[[noreturn]] void no_mpi(const std::string& what) {
  throw std::runtime_error(what +
                           ": this build of zcoll has no MPI of its own (built with "
                           "ZCOLL_WITH_MPI off or without an MPI compiler wrapper), so it runs "
                           "on one node only");
}

// "zcoll.<op> across nodes", or "zcoll.<op> plan across nodes".
[[noreturn]] void no_mpi(op_code op, const char* kind = "") {
  no_mpi("zcoll." + std::string(name_of(op)) + kind + " across nodes");
}

}  // namespace

void finish_round(node_context&, node_messages&, const nodes_route&, const std::string& what) {
  no_mpi(what);
}

void agree_across_nodes(node_context&, const call_record&, const nodes_route&,
                        const std::string& what) {
  no_mpi(what);
}

void collective_across_nodes(node_context&, op_code op, const array_view*, const array_view&, int,
                             int, const call_record&, const nodes_route&) {
  no_mpi(op);
}

void blocks_between_nodes(node_context&, op_code op, const array_view*, const array_view&,
                          const nodes_route&) {
  no_mpi(op);
}

void irregular_across_nodes(node_context&, op_code op, const v_call*, const call_record&,
                            const nodes_route&) {
  no_mpi(op);
}

void reduction_across_nodes(node_context&, op_code op, const reduction_call*, const call_record&,
                            const nodes_route&) {
  no_mpi(op);
}

void transfer_across_nodes(node_context&, const transfer_geometry&, const array_view&,
                           const array_view&, int, int, const nodes_route&) {
  no_mpi(op_code::transfer);
}

std::unique_ptr<plan_between_nodes> collective_plan_blocks(std::shared_ptr<node_context>,
                                                           op_code op, const array_view*,
                                                           const array_view&, const nodes_route&,
                                                           int) {
  no_mpi(op, " plan");
}

std::unique_ptr<plan_between_nodes> irregular_plan_blocks(std::shared_ptr<node_context>, op_code op,
                                                          bool, const nodes_route&, int) {
  no_mpi(op, " plan");
}

std::unique_ptr<transfer_between_nodes> transfer_plan_blocks(std::shared_ptr<node_context>,
                                                             const transfer_geometry&,
                                                             const nodes_route&, int) {
  no_mpi(op_code::transfer, " plan");
}

}  // namespace zcoll
