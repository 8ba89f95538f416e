/*
 * The messages of a round between nodes (aggregate.hpp's phase 2), sent and received by MPI
 * point-to-point from C++.
 *
 * The only part of zcoll that calls MPI, kept out of the MPI-free engine (zcoll_core) in a
 * library of its own (zcoll_mpi, with across_nodes.cpp), built when CMake finds an MPI; a build
 * without one has across_nodes_without_mpi.cpp and bind_no_mpi.cpp in its place and raises on
 * communicators spanning several nodes. The communicator comes from mpi4py as its C
 * handle (MPI._handleof), so both must use the same MPI library: mpi_library_matches() tells.
 *
 * Protocol, per rank: at most `window` sends in flight (TPDS'18 §2.5: sqrt(P)), posted in
 * order; every expected message is matched with MPI_Improbe first, so one of an unexpected size
 * (calls that differ between nodes) is received whole and only its head -- the call records,
 * whose size is known -- kept. Waits poll, then yield, then sleep 1 ms slices, bounded by the
 * wait options' timeout: the ranks still waited for are named in the peer_error. Trade-off
 * against an mpi4py loop (measured, CHANGELOG.md): no request objects or Python frames per
 * message and the GIL released for the whole round, at the price of building against MPI's
 * headers.
 *
 * Beside the rounds, the collectives a global transpose on a communicator without a context
 * runs (collective_transpose: zcoll.fft's first runs, fft/_mpi_runs.py), with the same bounded
 * waits: there one crossing replaces mpi4py's request objects, argument lists and a Python
 * polling loop, which cost a cold transpose more than the MPI calls themselves.
 */
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zcoll/aggregate.hpp"
#include "zcoll/message_flow.hpp"

namespace zcoll {

struct message_round_options {
  int tag = 0;                      // the round's tag on the communicator (exchange_messages)
  int window = 1;                   // sends in flight per rank at most (exchange_messages)
  std::uint32_t eager_polls = 100;  // polls before the wait starts yielding
  double timeout_s = 60.0;          // bound on the whole exchange; then peer_error
  std::string what = "messages between nodes";  // named in the timeout's message
};

// The options of a wait bounded by `timeout` s whose PeerError names `what`; the rest default.
message_round_options round_options(double timeout, std::string what);

// The communicator behind mpi4py's MPI._handleof(comm).
MPI_Comm comm_from_handle(std::uintptr_t handle) noexcept;

// Whether this library's MPI is initialized, not finalized, of the family of the headers it was
// compiled with (Open MPI or MPICH, by name), and reports `version` (mpi4py's
// MPI.Get_library_version()): false when zcoll was built against another MPI than mpi4py runs
// (derivatives not named so, such as Intel MPI, then use the mpi4py loop).
bool mpi_library_matches(const std::string& version);

// The MPI_Get_library_version of the library this was linked with (callable before MPI_Init).
std::string linked_library_version();

// Sends `out`, receives `in` (messages keep their addresses and expected sizes), on `comm`.
// Throws peer_error naming the late ranks after options.timeout_s, wait_interrupted when
// the interrupt check asks; unfinished requests are then freed (MPI completes them).
void exchange_messages(MPI_Comm comm, std::span<const node_message> out,
                       std::span<const node_message> in, int rank,
                       const message_round_options& options);

// Receives `recvs` and sends `sends` (all posted at once), on `comm`; the same bounds and
// errors as exchange_messages. The k-th message of a (peer, tag) matches the k-th buffer
// (MPI's non-overtaking order).
void exchange_buffers(MPI_Comm comm, std::span<const peer_buffer> recvs,
                      std::span<const peer_buffer> sends, int rank,
                      const message_round_options& options);

// Runs `flow` on `comm`: posts what it hands over, tells it each receive that arrived, until
// nothing is in flight and it hands over nothing more. The bounds and errors of
// exchange_buffers, the timeout counted from the last message that completed (a long flow that
// keeps moving is not cut short).
void exchange_flow(MPI_Comm comm, message_flow& flow, int rank,
                   const message_round_options& options);

// The blocks a persistent plan exchanges between nodes on every run: MPI persistent requests
// made once (MPI_Recv_init, MPI_Send_init on `comm`), started together and waited for with the
// bounds and errors of exchange_messages. Freed with the object (not after MPI_Finalize).
class persistent_messages {
 public:
  persistent_messages(MPI_Comm comm, std::span<const peer_buffer> recvs,
                      std::span<const peer_buffer> sends);
  ~persistent_messages();
  persistent_messages(const persistent_messages&) = delete;
  persistent_messages& operator=(const persistent_messages&) = delete;

  void start();
  void wait(int rank, const message_round_options& options);
  bool test();

 private:
  void free_all() noexcept;

  std::vector<MPI_Request> requests_;
  std::vector<int> peers_;
};

// A part of a C-ordered array sent to or received from `peer` with `tag`: the elements whose
// index along `axis` lies in [start, start + count), of an array of `shape` whose elements
// have `itemsize` bytes (a global transpose's block between nodes).
struct peer_slab {
  int peer = 0;
  int tag = 0;
  std::vector<std::uint64_t> shape;
  int axis = 0;
  std::uint64_t start = 0;
  std::uint64_t count = 0;
  std::size_t itemsize = 0;
};

// MPI datatypes that one object made and frees with itself (unless MPI is finalized by then:
// freeing is erroneous after MPI_Finalize). A type still used by a request that was left to
// MPI is only marked for freeing, so an object may go before its last run completes.
class owned_types {
 public:
  owned_types() = default;
  ~owned_types();
  owned_types(const owned_types&) = delete;
  owned_types& operator=(const owned_types&) = delete;

  // The committed subarray type of `slab` (its peer and tag aside), freed with this object.
  MPI_Datatype subarray(const peer_slab& slab);

 private:
  std::vector<MPI_Datatype> types_;
};

// The blocks between nodes of a global transpose: one MPI subarray datatype per block, made
// once; every run posts them on the arrays it is given (receives into `recv`, sends from
// `send`) and waits with the bounds and errors of exchange_messages. MPI packs a subarray as it
// goes, so nothing is staged here. Freed with the object (not after MPI_Finalize).
class slab_messages {
 public:
  slab_messages(std::span<const peer_slab> recvs, std::span<const peer_slab> sends);
  ~slab_messages();
  slab_messages(const slab_messages&) = delete;
  slab_messages& operator=(const slab_messages&) = delete;

  void post(MPI_Comm comm, void* recv, const void* send);
  bool test();
  void wait(int rank, const message_round_options& options);

 private:
  struct typed_block {
    int peer;
    int tag;
    bool receive;
    MPI_Datatype type;
  };

  owned_types types_;  // first: a constructor that throws frees the types made so far
  std::vector<typed_block> blocks_;
  std::vector<MPI_Request> requests_;  // the current run's, in blocks_' order
};

// Collective over `comm`: the smallest of the ranks' `code` (one MPI_Iallreduce), the wait
// bounded like exchange_messages'. One that gives up leaves the request to MPI, with its
// buffers (never freed).
int agree_min(MPI_Comm comm, int code, int rank, const message_round_options& options);

// A global transpose between the `size` ranks of a communicator as one MPI collective: array
// A (this rank's `shape_a`, cut along `axis_a` into the ranks' blocks, block_share's
// distribution) to array B (`shape_b`, cut along `axis_b`) and back, each direction one
// MPI_Ialltoallw of subarray datatypes made once (what mpi4py-fft's Transfer sends, so MPI
// packs as it goes and nothing is staged). The types depend on the shapes and `size` only, so
// one object serves every communicator of that size (a Pencil per stage, a test suite's
// loops). Waits as agree_min's: a run that gives up leaves its request to MPI, and the caller
// keeps the arrays it writes. Freed with the object (not after MPI_Finalize).
class collective_transpose {
 public:
  collective_transpose(int size, std::size_t itemsize, std::span<const std::uint64_t> shape_a,
                       int axis_a, std::span<const std::uint64_t> shape_b, int axis_b);

  // Collective over `comm` (of the object's size): direction `side` (0: A to B), from `send`
  // into `recv`.
  void run(MPI_Comm comm, int side, const void* send, void* recv, int rank,
           const message_round_options& options);

 private:
  // An array's blocks, one per rank: MPI_Ialltoallw's counts, displacements and types.
  struct blocks {
    std::vector<int> counts, displacements;
    std::vector<MPI_Datatype> types;
  };
  blocks blocks_of(std::span<const std::uint64_t> shape, int axis);

  owned_types types_;  // first: a constructor that throws frees the types made so far
  int size_;
  std::size_t itemsize_;
  std::array<blocks, 2> arrays_;  // A's, B's
};

}  // namespace zcoll
