/*
 * Reductions on the shared heap (HPDC'13 §2): allreduce, reduce, reduce_scatter_block and bcast
 * among the ranks of one node, every rank reading its peers' buffers where they are.
 *
 * A call publishes where this rank's input is -- its own buffer when that is in the arena, else
 * a copy in its eager slot (small calls) or in its staging partition -- and agrees on the call
 * (protocol.hpp: sizes, dtype, op, root, algorithm; a bad argument anywhere raises the same
 * error on every rank before anything is read). Then one of four algorithms combines the
 * inputs with the kernels of reduce_kernels.hpp, between node barriers:
 *
 *   flat           every rank folds all P inputs itself, in rank order. Small calls copy their
 *                  input into the eager slot first, so the whole call is one barrier; P*m bytes
 *                  read per rank, so only for small m (or P = 2).
 *   tree           groups of ranks that share a NUMA node, then NUMA nodes of a package, then
 *                  packages (from hwloc, context_config): each group's leader folds its
 *                  members' partial results, one barrier per level; every rank then copies the
 *                  root's result.
 *   dissemination  recursive doubling: in round k rank r combines its value with rank r^2^k's,
 *                  both computing (lower op higher) so partners hold identical bits; ranks past
 *                  the largest power of two are folded into a partner first and copy its result
 *                  last (the paper's "excess" set). One barrier per round.
 *   tiled          the buffer cut into P cache-line-aligned tiles; rank i folds tile i of every
 *                  input (a reduce-scatter reading every peer in place), barrier, then every
 *                  rank copies every tile (an allgather). Reads m + m, writes m/P + m per rank:
 *                  the least memory traffic, for large m.
 *
 * bcast copies the root's buffer into every other rank's: from where it is (arena, heap, eager
 * slot), or, when it is private, pulled by CMA (cma.hpp; sizes the policy pulls) or staged. A
 * reduction folds a peer's private input only after copying it: staged whole before the
 * call's first barrier or, at the sizes the policy pulls, pulled by the tiled or the flat
 * algorithm a piece at a time into scratch that stays in cache until the fold.
 *
 * Determinism: each algorithm combines in an order fixed by (P, algorithm, size) -- never by
 * timing -- and exactly one rank computes each element of the result (tree, tiled) or partners
 * compute it from the same operands in the same order (flat, dissemination), so the result is
 * bit-identical on every rank and from run to run.
 *
 * Synchronisation: intermediate results live in each rank's staging partition, cut into three
 * fixed thirds (input copy, two work buffers), and are written only after the call's first
 * barrier; inputs are read only before the call's last barrier. So a call needs no completion
 * barrier after its last reads of work buffers: a peer can rewrite them only after the next
 * call's first barrier, which needs every rank to have left this one. Eager slots alternate by
 * barrier parity as for alltoall. Only bcast (a peer reads the root's buffer last) and flat
 * without eager slots end with a barrier after their reads of inputs.
 */
#pragma once

#include <vector>

#include "zcoll/checks.hpp"
#include "zcoll/registry.hpp"

namespace zcoll {

// One rank's arguments to a call of the reduction family, as the binding passes them.
struct reduction_call {
  op_code op = op_code::allreduce;   // allreduce, reduce, reduce_scatter or bcast
  const array_view* send = nullptr;  // nullptr: in place (recv holds the input); bcast: unused
  const array_view* recv = nullptr;  // the result (bcast: the buffer); nullptr: none wanted
  int reduce = 0;                    // reduce_op code (bcast: unused)
  int algorithm = auto_algorithm;    // reduce_algorithm code or auto_algorithm (bcast: unused)
  int root = 0;                      // communicator rank (reduce, bcast)
};

// The reduction tree of a node: levels, each a list of groups (leader first, then its members
// in rank order); the leader of a group folds [leader, members...] at that level. The levels
// follow the hardware from the inside out (HPDC'13 §3): the ranks under one L3 cache, then one
// NUMA node, then one package, then the node. `numa`, `package` and `l3` give each node rank's
// NUMA node, package and L3 cache (empty or -1: unknown, one group); a level where no group
// has two members is left out.
using tree_group = std::vector<int>;
std::vector<std::vector<tree_group>> make_reduction_tree(int size, const std::vector<int>& numa,
                                                         const std::vector<int>& package,
                                                         const std::vector<int>& l3 = {});

}  // namespace zcoll
