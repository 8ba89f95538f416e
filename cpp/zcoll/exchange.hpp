/*
 * Exchange: one node's part of a collective, executed as an ordered list of block copies
 * between two barriers, on a per-communicator node context.
 *
 * Protocol of one call (no MPI anywhere):
 *   1. each rank writes a descriptor of its call (operation, sizes, dtype, where its buffers are
 *      as (segment id, offset), or an argument error it found locally) into its slot of the
 *      control segment; slots are double-buffered by call parity, so a fast rank's next call
 *      never overwrites what a slow rank is still reading;
 *   2. barrier;
 *   3. every rank reads every descriptor and checks they agree. All ranks see the same data, so
 *      they all reach the same verdict: either every rank raises the same error (nothing was
 *      copied, nothing corrupted) or every rank goes on;
 *   4. private (non-arena) buffers are staged through a per-rank staging partition (one extra
 *      copy on each side and one extra barrier: documented cost);
 *   5. rank i copies segment i of the schedule (see schedule.hpp);
 *   6. barrier; receive buffers that were staged are copied out.
 * Blocks are addressed by communicator rank, so the same code runs the node-local part of a
 * communicator that spans several nodes (Python moves the rest with MPI point-to-point).
 *
 * Small messages under order="auto" take an eager path instead: each rank copies its data into
 * its own slot of an eager segment, one barrier, then each rank pulls its receive row from the
 * peers' slots. Two copies instead of one, but one barrier instead of two: what dominates for
 * small blocks, and far more so when ranks outnumber cores. Slots and descriptor lines alternate
 * by barrier parity, so a rank that races ahead into its next call never overwrites what a slow
 * peer is still reading: no completion barrier is needed.
 *
 * order="auto" takes the eager path for calls receiving at most the eager size per rank and the
 * built-in default_order otherwise, unless a tuning-table rule (set_tuning_rules, from
 * python -m zcoll.tune) covers the call's block size: then the rule's order, or the eager path
 * where the call fits it. Every rank of a node holds the same rules (broadcast at context
 * creation), so they all resolve "auto" alike.
 *
 * Collective allocation uses the same descriptor round: ranks whose partitions are full make
 * the node add a segment (leader creates, all map and reserve their partition, leader unlinks).
 * After a peer failure the context is broken for good and every later call says so.
 */
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zcoll/arena.hpp"
#include "zcoll/barrier.hpp"
#include "zcoll/copy_choice.hpp"
#include "zcoll/options.hpp"
#include "zcoll/schedule.hpp"
#include "zcoll/transfer.hpp"

namespace zcoll {

// Kind of a locally detected argument error; maps to a Python exception type.
enum class arg_error : std::uint8_t { none = 0, value = 1, type = 2 };

// The element type as NumPy describes it; only equality matters to the core.
struct dtype_id {
  std::uint32_t kind = 0;  // dtype.char
  std::uint32_t itemsize = 0;  // bytes
  friend bool operator==(const dtype_id&, const dtype_id&) = default;
};

// One rank's arguments to one collective.
struct collective_args {
  op_code op = op_code::alltoall;
  const void* send = nullptr;  // nullptr: in place (the receive buffer holds the data)
  std::size_t send_bytes = 0;
  void* recv = nullptr;
  std::size_t recv_bytes = 0;
  std::size_t block_bytes = 0;  // bytes per rank-to-rank block
  dtype_id dtype;
  block_order order = block_order::morton;
  bool eager = false;  // small message: one barrier through the eager slots (see node_context)
  int copy = auto_copy;  // copy_mode of the block copies, or auto_copy (see copy_choice.hpp)
};

// A NumPy array as the binding sees it (no Python types in the core).
struct array_view {
  const void* data = nullptr;
  std::size_t nbytes = 0;
  std::size_t size = 0;       // elements
  int ndim = 0;
  std::size_t first_dim = 0;  // shape[0]; 0 when ndim == 0
  const std::int64_t* shape = nullptr;  // ndim extents, valid during the call
  dtype_id dtype;
  bool c_contiguous = true;
  bool writeable = true;
  bool has_objects = false;
};

// Outcome of the local (this rank only) argument checks of one collective call.
struct local_check {
  arg_error error = arg_error::none;
  std::string message;          // why, when error != none
  std::size_t block_bytes = 0;  // bytes per block, when the arguments are fine
  bool ok() const noexcept { return error == arg_error::none; }
};

// Checks one rank's buffers for `op` on a communicator of `comm_size` ranks; `send` is nullptr
// for an in-place call. Checks that need the other ranks happen inside the collective.
local_check check_local_args(op_code op, int comm_size, const array_view* send,
                             const array_view& recv);

// Checks one rank's arrays for a transfer of geometry `g` as rank `comm_rank`: `send` aligned in
// axis a, `recv` aligned in axis b, both C-contiguous with the local shapes `g` implies.
local_check check_transfer_args(const transfer_geometry& g, int comm_rank, const array_view& send,
                                const array_view& recv);

// Parses "auto" | "row" | "column" | "morton" | "hilbert"; "auto" -> default_order(p, block).
bool parse_order(std::string_view name, int p, std::size_t block_bytes, block_order* order);

// A tuning-table rule for order="auto" on blocks in `range`.
struct order_rule {
  block_range range;
  int order = auto_order;  // block_order value, eager_order, or auto_order (built-in)
};

// What order="auto" resolves to for one call.
struct auto_choice {
  block_order order = block_order::row;  // the ordered schedule, also when `eager` is set
  bool eager = false;                    // take the eager path
  bool from_rule = false;                // a tuning rule decided (not the built-in rule)
};

// How the context was set up: which node ranks, which communicator ranks, how to wait.
struct context_config {
  int rank = 0;                        // this process among the node's ranks
  int size = 1;                        // ranks of the communicator on this node
  int comm_size = 1;                   // ranks of the whole communicator (blocks per buffer)
  std::vector<int> comm_ranks;         // communicator rank of each node rank
  std::vector<std::int32_t> pids;      // pid of each node rank
  barrier_kind barrier = barrier_kind::central;
  wait_options wait;
};

namespace detail {

inline constexpr std::size_t message_bytes = 240;

// The one cache line a rank publishes per step: its barrier arrival count and the descriptor
// of the call it is making. Fields are written before `entered` is released and read by peers
// after they acquire it; a rank rewrites them only after a barrier that follows every read.
struct alignas(cache_line) rank_line {
  std::atomic<std::uint64_t> entered;  // barrier arrivals (see barrier.hpp)
  op_code op;                          // 1 byte each below: enum values are small
  std::int8_t order;  // block_order value, auto_order or eager_order
  std::uint8_t flag;   // collectives: in place; allocate: request fits the rank's partitions
  arg_error error;
  dtype_id dtype;
  std::uint64_t block_bytes;  // collectives: bytes per block; allocate: bytes requested
  buffer_ref send, recv;
};
static_assert(sizeof(rank_line) == cache_line, "the descriptor must fit one cache line");

// Cold per-rank data: error text, segment-creation status.
struct alignas(cache_line) rank_slot {
  char message[message_bytes];  // why this rank's arguments are invalid
  std::int32_t status;          // segment creation: 0 or failed
  char status_message[message_bytes];
};

struct alignas(cache_line) control_header {
  barrier_shared barrier;
  // Announcement of a new segment, written by the leader between two barriers.
  char segment_name[128];
  std::uint64_t segment_id;
  std::uint64_t segment_partition;
  std::int32_t segment_status;
  char segment_message[message_bytes];
};

}  // namespace detail

class node_context {
 public:
  // Bytes of the control segment for `size` node ranks (created and shared by the caller).
  static std::size_t control_bytes(int size) noexcept;

  node_context(std::shared_ptr<shm_segment> control, context_config config);
  ~node_context();
  node_context(const node_context&) = delete;
  node_context& operator=(const node_context&) = delete;

  // Collective: every node rank allocates `bytes` (may differ per rank) in the arena.
  std::shared_ptr<arena_block> allocate(std::size_t bytes);
  // Collective: runs alltoall or allgather as described in args.
  void execute(const collective_args& args);
  // Collective: checks one rank's arguments, raises on every rank if any rank's are wrong,
  // else executes. The entry point of the Python API on a single-node communicator.
  // `order` is a block_order value or auto_order; `copy` a copy_mode value or auto_copy.
  void run(op_code op, const array_view* send, const array_view& recv, int order,
           int copy = auto_copy);
  // Collective: the node's part of a global transpose (blocks between ranks of this node);
  // checks the arguments like run(). `order` is a block_order value or auto_order.
  void run_transfer(const transfer_geometry& g, const array_view& send, const array_view& recv,
                    int order, int copy = auto_copy);
  // Collective: this rank found its arguments invalid; every rank throws (type from `kind`).
  [[noreturn]] void fail(op_code op, arg_error kind, const std::string& message);
  // Collective: a node barrier.
  void barrier();
  // Collective: enables the eager path for calls receiving at most `bytes` per rank (0: never).
  void setup_eager(std::size_t bytes);
  // Largest per-rank receive size the eager path takes (0: no eager path).
  std::size_t eager_bytes() const noexcept { return eager_ ? eager_bytes_ : 0; }
  // Local (same on every node rank): the tuning rules of `op` (alltoall or allgather); throws
  // std::invalid_argument for overlapping ranges or unknown codes.
  void set_tuning_rules(op_code op, std::vector<order_rule> orders, std::vector<copy_rule> copies);
  // What order="auto" does for an `op` call with blocks of `block_bytes`, each rank receiving
  // `recv_bytes`.
  auto_choice resolve_auto(op_code op, std::size_t block_bytes, std::size_t recv_bytes) const;
  // Local: where [p, p + bytes) is, in terms every rank of this context can resolve
  // ({0, 0} when it is not in an arena segment that all of them have mapped).
  buffer_ref where(const void* p, std::size_t bytes) { return locate(p, bytes); }
  // Local: a view of `bytes` at `ref` (published by a peer); keeps the mapping alive.
  std::shared_ptr<arena_block> view(const buffer_ref& ref, std::size_t bytes);
  // Local: unmaps everything this context owns; later calls raise. Arrays stay valid.
  void close() noexcept;

  bool closed() const noexcept { return closed_; }
  bool broken() const noexcept { return !broken_reason_.empty(); }
  const context_config& config() const noexcept { return config_; }
  void set_wait_options(const wait_options& w) noexcept { barrier_->set_options(w); }
  // Called before any wait of this context starts yielding or sleeping (see block_hook).
  void set_block_hook(block_hook hook) noexcept { barrier_->set_block_hook(hook); }
  std::size_t arena_bytes_in_use() const { return allocator_->bytes_in_use(); }
  std::size_t segment_count() const noexcept { return segments_.size(); }
  std::uint64_t calls() const noexcept { return calls_; }
  // How this rank picks copy modes (threshold, what "auto" learned).
  copy_chooser& copy_choice() noexcept { return copy_; }
  // What a call where each rank receives `received` bytes reads and writes on the node: the
  // receive buffers and as much source.
  std::size_t touched_bytes(std::size_t received) const noexcept {
    return 2 * received * static_cast<std::size_t>(config_.size);
  }
  // The schedule this context uses for `op` (in place or not) and `order`.
  const schedule& schedule_for(op_code op, bool in_place, block_order order);

 private:
  struct known_segment {
    std::shared_ptr<data_segment> seg;
    bool shared_by_all;  // every rank of this context has it mapped (so peers can resolve it)
  };
  // Every rank's descriptor published at one barrier (lines alternate by barrier parity).
  struct descriptors {
    const detail::rank_line* lines;
    std::size_t parity;
    const detail::rank_line& operator[](std::size_t r) const noexcept {
      return lines[2 * r + parity];
    }
  };
  // Parity of the barrier the next publication goes with.
  std::size_t publish_parity() const noexcept { return (barrier_->completed() + 1) & 1; }

  void check_usable() const;
  detail::rank_line& next_descriptor(op_code op);
  descriptors publish_and_sync();
  // Throw the same verdict on every rank when the ranks' calls do not fit together.
  void check_agreement(descriptors all, op_code op) const;
  void check_arguments(descriptors all) const;
  buffer_ref locate(const void* p, std::size_t bytes);
  std::byte* resolve(const buffer_ref& ref);
  void sync();  // barrier that marks the context broken when it throws
  const known_segment& remember(std::shared_ptr<data_segment> seg);
  std::shared_ptr<data_segment> create_segment(std::size_t partition_bytes);
  void ensure_staging(std::size_t bytes);
  void stage_in(const collective_args& args, bool in_place, std::size_t send_part,
                const buffer_ref& my_send, const buffer_ref& my_recv);
  void execute_eager(const collective_args& args);
  void execute_transfer(const transfer_geometry& g, const array_view& send,
                        const array_view& recv, block_order order, int copy);
  // Base address of every node rank's buffer (`recv` or `send` side) published for a call that
  // cannot stage; throws the same error on every rank when one is not in the arena.
  void resolve_all(descriptors all, bool send_side, std::vector<std::byte*>* bases);
  std::byte* eager_slot(int rank, std::size_t parity) const noexcept {
    return eager_->partition(rank) + parity * eager_bytes_;
  }
  // Runs `copies(plan)` with the plan copy_ picks for blocks of `block` bytes under mode code
  // `copy` in a call where each rank receives `received` bytes, timed when "auto" is still
  // refining its threshold (`bytes`: what this rank copies).
  // `table`: the rule table of the collective (no_rules for a transfer).
  template <class Copies>
  void timed_copies(std::size_t block, int copy, std::size_t received, std::size_t bytes,
                    int table, Copies&& copies) {
    bool tuning = false;
    const std::size_t node_bytes = touched_bytes(received);
    const copy_plan how = copy_.choose(copy, block, node_bytes, &tuning, table);
    if (!tuning) {
      copies(how);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    copies(how);
    store_fence();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    copy_.record(block, how, bytes, took.count());
  }
  void run_schedule(const schedule& sched, op_code op, bool in_place, std::size_t block,
                    const std::vector<std::byte*>& send, const std::vector<std::byte*>& recv,
                    const copy_plan& how);
  std::string rank_name(int node_rank) const;

  std::shared_ptr<shm_segment> control_;
  detail::control_header* header_ = nullptr;
  detail::rank_line* lines_ = nullptr;                    // two per node rank (by parity)
  detail::barrier_rank_words* barrier_words_ = nullptr;  // one per node rank
  detail::rank_slot* slots_ = nullptr;                    // one per node rank
  context_config config_;
  std::vector<std::int32_t> sorted_pids_;
  std::unique_ptr<node_barrier> barrier_;
  std::shared_ptr<detail::partition_allocator> allocator_;
  std::vector<known_segment> segments_;  // every segment this context has met
  std::vector<std::shared_ptr<data_segment>> owned_;     // segments this context created
  std::shared_ptr<data_segment> staging_;
  std::shared_ptr<data_segment> eager_;  // two slots of eager_bytes_ per rank, by parity
  std::size_t eager_bytes_ = 0;
  std::array<std::vector<order_rule>, rule_tables> order_rules_;  // tuning table, by rule_table
  std::size_t next_partition_bytes_;
  std::map<std::uint32_t, schedule> schedules_;
  copy_chooser copy_;
  std::vector<std::byte*> send_bases_, recv_bases_;  // per call, kept to avoid reallocating
  std::uint64_t calls_ = 0;
  bool closed_ = false;
  std::string broken_reason_;
};

// Order used for order="auto" when no tuning table says otherwise.
block_order default_order(int p, std::size_t block_bytes) noexcept;

// The kind of schedule `op` (alltoall or allgather) runs, in place or not.
schedule_kind schedule_kind_of(op_code op, bool in_place) noexcept;

// One rank's part of an alltoall or allgather: copies the blocks of `segment` between the node
// ranks' buffers (`send`, `recv`: base address of each node rank's buffer; `send` unused in
// place). Node rank j's blocks sit at index comm_ranks[j] of a buffer. The engine's one mapping
// from a schedule to copies; tools/replay.cpp replays it in one process.
void copy_segment(std::span<const block_coord> segment, op_code op, bool in_place,
                  std::size_t block, std::byte* const* send, std::byte* const* recv,
                  const int* comm_ranks, const copy_plan& how) noexcept;

}  // namespace zcoll
