#include "zcoll/mpi_messages.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "zcoll/barrier.hpp"
#include "zcoll/error.hpp"
#include "zcoll/transfer.hpp"

namespace zcoll {

namespace {

using clock_type = std::chrono::steady_clock;

// A message that arrived with another size than expected: received whole, its head kept.
struct resized_message {
  const node_message* into;
  std::vector<std::byte> whole;
};

// Polls, then yields (a peer may need this core), then sleeps once the wait is clearly long;
// gives up at the deadline, naming the ranks `late()` returns.
class bounded_wait {
 public:
  bounded_wait(const message_round_options& options, int rank)
      : options_(options), rank_(rank), start_(clock_type::now()) {}

  template <class Late>
  void pause(Late late) {
    if (++polls_ < options_.eager_polls) return;
    const double waited = std::chrono::duration<double>(clock_type::now() - start_).count();
    if (waited >= options_.timeout_s) give_up_naming(late);
    if (waited < 0.01) {
      ::sched_yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (interrupt_requested())
      throw wait_interrupted("zcoll: rank " + std::to_string(rank_) + ": " + options_.what +
                             ": interrupted");
  }

  // Something completed: the wait (its backoff and its timeout) starts again -- unless a
  // message failed, after which the wait only runs out.
  void progressed() {
    if (broken()) return;
    polls_ = 0;
    start_ = clock_type::now();
  }
  // A message to or from `peer` failed (MPI returned an error: a dead peer, a reset
  // connection): it will never arrive, so the wait cannot end well; it gives up at its bound,
  // naming `peer`, however much else completes meanwhile.
  void failed(int peer) { failed_.push_back(peer); }
  // Gives up once `seconds` have passed since the wait began, however often it progressed:
  // a flow's messages each reset the bound, and this keeps their sum bounded too.
  template <class Late>
  void cap(double seconds, Late late) {
    if (std::chrono::duration<double>(clock_type::now() - began_).count() >= seconds)
      give_up_naming(late);
  }
  bool broken() const noexcept { return !failed_.empty(); }

 private:
  // Gives up, naming the ranks `late()` returns and those whose messages failed.
  template <class Late>
  [[noreturn]] void give_up_naming(Late late) const {
    std::vector<int> who = late();
    who.insert(who.end(), failed_.begin(), failed_.end());
    give_up(std::move(who));
  }
  [[noreturn]] void give_up(std::vector<int> late) const {
    std::erase_if(late, [](int r) { return r < 0; });  // -1: a failure MPI named no peer of
    std::sort(late.begin(), late.end());
    late.erase(std::unique(late.begin(), late.end()), late.end());
    std::string who = "rank(s) [";
    for (std::size_t i = 0; i < late.size(); ++i) who += (i ? ", " : "") + std::to_string(late[i]);
    who += "]";
    if (late.empty()) who = "a peer on another node";
    char timeout[32];  // as Python prints a float, like the messages of the mpi4py path
    const double t = options_.timeout_s;
    std::snprintf(timeout, sizeof timeout, t == std::floor(t) && t < 1e15 ? "%.1f" : "%g", t);
    throw peer_error("zcoll: rank " + std::to_string(rank_) + ": " + options_.what + ": " + who +
                     " did not take part within " + timeout +
                     " s (set ZCOLL_TIMEOUT or zcoll.set_timeout to change it)");
  }

  const message_round_options& options_;
  int rank_;
  clock_type::time_point start_;
  clock_type::time_point began_ = start_;
  std::uint32_t polls_ = 0;
  std::vector<int> failed_;
};

bool done(MPI_Request& request) {
  int flag = 0;
  MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
  return flag != 0;
}

// Frees what is still in flight when the round gives up (MPI finishes it in the background).
struct request_list {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  ~request_list() {
    for (MPI_Request& r : requests)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  void add(MPI_Request r, int peer) {
    requests.push_back(r);
    peers.push_back(peer);
  }
  std::vector<int> unfinished() {
    std::vector<int> late;
    for (std::size_t i = 0; i < requests.size(); ++i)
      if (requests[i] != MPI_REQUEST_NULL && !done(requests[i])) late.push_back(peers[i]);
    return late;
  }
};

// A C handle as mpi4py's MPI._handleof gives it: a pointer (Open MPI) or an integer (MPICH).
template <class Handle>
Handle handle_as(std::uintptr_t handle) noexcept {
  if constexpr (std::is_pointer_v<Handle>)
    return reinterpret_cast<Handle>(handle);
  else
    return static_cast<Handle>(handle);
}

// MPI's count of a message of `bytes` bytes (MPI_BYTE), which must fit an int.
int byte_count(std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw usage_error("zcoll: a message between nodes of " + std::to_string(bytes) +
                      " bytes exceeds MPI's count limit (2 GiB)");
  return static_cast<int>(bytes);
}

bool mpi_finalized() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// Whether every one of `requests` finished (none: true). An error is not an end: the caller's
// bounded wait runs out instead.
bool all_done(std::vector<MPI_Request>& requests) {
  int finished = 0;
  const int rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &finished,
                             MPI_STATUSES_IGNORE);
  return rc == MPI_SUCCESS && finished != 0;
}

// MPI_Testall of `requests` within `wait`: whether all finished well. A failed request's peer
// (`peer(i)`) goes to `wait`, which from then on only runs out.
template <class PeerOf>
bool all_done_within(std::vector<MPI_Request>& requests, std::vector<MPI_Status>& statuses,
                     PeerOf peer, bounded_wait& wait) {
  int finished = 0;
  statuses.resize(requests.size());
  const int rc =
      MPI_Testall(static_cast<int>(requests.size()), requests.data(), &finished, statuses.data());
  if (rc == MPI_ERR_IN_STATUS) {
    for (std::size_t i = 0; i < statuses.size(); ++i)
      if (statuses[i].MPI_ERROR != MPI_SUCCESS && statuses[i].MPI_ERROR != MPI_ERR_PENDING)
        wait.failed(peer(i));
  } else if (rc != MPI_SUCCESS) {
    wait.failed(-1);
  }
  return !wait.broken() && finished != 0;
}

// Waits for `requests` within `wait`; `peer(i)` is the rank behind request i.
template <class PeerOf>
void wait_within(std::vector<MPI_Request>& requests, PeerOf peer, bounded_wait& wait) {
  std::vector<MPI_Status> statuses;
  while (!all_done_within(requests, statuses, peer, wait))
    wait.pause([&] {
      std::vector<int> late;
      for (std::size_t i = 0; i < requests.size(); ++i)
        if (requests[i] != MPI_REQUEST_NULL && !done(requests[i])) late.push_back(peer(i));
      return late;
    });
}

// Waits for `requests` within `options`' bounds; `peer(i)` is the rank behind request i.
template <class PeerOf>
void wait_requests(std::vector<MPI_Request>& requests, PeerOf peer, int rank,
                   const message_round_options& options) {
  bounded_wait wait(options, rank);
  wait_within(requests, peer, wait);
}

// Frees `requests` (MPI finishes those still in flight); call only before MPI_Finalize.
void free_requests(std::vector<MPI_Request>& requests) noexcept {
  for (MPI_Request& r : requests)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  requests.clear();
}

void wait_for_all(request_list& all, bounded_wait& wait) {
  wait_within(all.requests, [&](std::size_t i) { return all.peers[i]; }, wait);
}

}  // namespace

MPI_Comm comm_from_handle(std::uintptr_t handle) noexcept {
  return handle_as<MPI_Comm>(handle);
}

message_round_options round_options(double timeout, std::string what) {
  message_round_options options;
  options.timeout_s = timeout;
  options.what = std::move(what);
  return options;
}

std::string linked_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return {};
  const std::string_view view(text, static_cast<std::size_t>(length));
  return std::string(view.substr(0, view.find('\0')));
}

bool mpi_library_matches(const std::string& version) {
  // The family of the headers this was compiled with must be the running library's: with two
  // MPI libraries in one process, MPI_* may resolve to the other one's functions.
#if defined(OPEN_MPI)
  if (version.find("Open MPI") == std::string::npos) return false;
#elif defined(MPICH_VERSION)
  if (version.find("MPICH") == std::string::npos) return false;
#endif
  int initialized = 0, finalized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized) return false;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return false;
  const std::string_view theirs(version);
  return linked_library_version() == theirs.substr(0, theirs.find('\0'));
}

void exchange_messages(MPI_Comm comm, std::span<const node_message> out,
                       std::span<const node_message> in, int rank,
                       const message_round_options& options) {
  const auto bytes = [](const node_message& m) { return byte_count(m.bytes); };
  request_list all;
  std::vector<std::size_t> in_flight;  // indices into all.requests of unfinished sends
  std::vector<const node_message*> pending;
  for (const node_message& m : in) pending.push_back(&m);
  std::vector<resized_message> resized;
  std::size_t next_send = 0;
  bounded_wait wait(options, rank);
  for (;;) {
    std::erase_if(in_flight, [&](std::size_t i) { return done(all.requests[i]); });
    for (; next_send < out.size() && in_flight.size() < std::size_t(options.window); ++next_send) {
      const node_message& m = out[next_send];
      MPI_Request r;
      MPI_Isend(m.data, bytes(m), MPI_BYTE, m.peer, options.tag, comm, &r);
      in_flight.push_back(all.requests.size());
      all.add(r, m.peer);
    }
    std::erase_if(pending, [&](const node_message* m) {
      int found = 0;
      MPI_Message message;
      MPI_Status status;
      MPI_Improbe(m->peer, options.tag, comm, &found, &message, &status);
      if (!found) return false;
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      void* into = m->data;
      if (static_cast<std::size_t>(count) != m->bytes) {
        resized.push_back({m, std::vector<std::byte>(static_cast<std::size_t>(count))});
        into = resized.back().whole.data();
      }
      MPI_Request r;
      MPI_Imrecv(into, count, MPI_BYTE, &message, &r);
      all.add(r, m->peer);
      return true;
    });
    if (pending.empty() && next_send == out.size()) break;
    wait.pause([&] {
      std::vector<int> late;
      for (const node_message* m : pending) late.push_back(m->peer);
      for (std::size_t i = next_send; i < out.size(); ++i) late.push_back(out[i].peer);
      return late;
    });
  }
  wait_for_all(all, wait);
  for (const resized_message& r : resized)
    std::memcpy(r.into->data, r.whole.data(), std::min(r.whole.size(), r.into->bytes));
}

namespace {

// Posts `recvs`, then `sends` (their requests numbered in that order in `all`).
void post_buffers(MPI_Comm comm, std::span<const peer_buffer> recvs,
                  std::span<const peer_buffer> sends, request_list& all) {
  for (const peer_buffer& b : recvs) {
    MPI_Request r;
    MPI_Irecv(b.data, byte_count(b.bytes), MPI_BYTE, b.peer, b.tag, comm, &r);
    all.add(r, b.peer);
  }
  for (const peer_buffer& b : sends) {
    MPI_Request r;
    MPI_Isend(b.data, byte_count(b.bytes), MPI_BYTE, b.peer, b.tag, comm, &r);
    all.add(r, b.peer);
  }
}

}  // namespace

void exchange_buffers(MPI_Comm comm, std::span<const peer_buffer> recvs,
                      std::span<const peer_buffer> sends, int rank,
                      const message_round_options& options) {
  request_list all;
  bounded_wait wait(options, rank);
  post_buffers(comm, recvs, sends, all);
  wait_for_all(all, wait);
}

namespace {

// After MPI_Testsome returned `rc`: moves the completions that succeeded to the front of
// `completed` and returns their number; the peers of the failed ones (every peer, for an error
// not in the statuses) go to `wait`, and their requests are freed so that no test reports
// them again.
int keep_completions(int rc, request_list& all, std::vector<int>& completed,
                     const std::vector<MPI_Status>& statuses, int count, bounded_wait& wait) {
  if (rc != MPI_ERR_IN_STATUS || count == MPI_UNDEFINED) {
    wait.failed(-1);
    return 0;
  }
  int kept = 0;
  for (int k = 0; k < count; ++k) {
    const auto i = static_cast<std::size_t>(completed[static_cast<std::size_t>(k)]);
    if (statuses[static_cast<std::size_t>(k)].MPI_ERROR == MPI_SUCCESS) {
      completed[static_cast<std::size_t>(kept++)] = static_cast<int>(i);
      continue;
    }
    wait.failed(all.peers[i]);
    if (all.requests[i] != MPI_REQUEST_NULL) MPI_Request_free(&all.requests[i]);
  }
  return kept;
}

}  // namespace

void exchange_flow(MPI_Comm comm, message_flow& flow, int rank,
                   const message_round_options& options) {
  request_list all;
  std::vector<peer_buffer> recvs, sends;
  std::vector<int> completed;
  std::vector<MPI_Status> statuses;
  std::size_t active = 0;  // requests are numbered as the flow numbers its messages
  bounded_wait wait(options, rank);
  // The whole flow gets the bound once per message and once more: each message restarts the
  // wait, and this keeps their sum bounded too.
  const auto post = [&] {
    recvs.clear();
    sends.clear();
    flow.take(recvs, sends);
    post_buffers(comm, recvs, sends, all);
    active += recvs.size() + sends.size();
  };
  post();
  for (;;) {
    wait.cap(options.timeout_s * static_cast<double>(all.requests.size() + 1),
             [&] { return all.unfinished(); });
    completed.resize(all.requests.size());
    statuses.resize(all.requests.size());
    int count = 0;
    if (active) {
      const int rc = MPI_Testsome(static_cast<int>(all.requests.size()), all.requests.data(),
                                  &count, completed.data(), statuses.data());
      if (rc != MPI_SUCCESS) count = keep_completions(rc, all, completed, statuses, count, wait);
    }
    if (wait.broken()) {  // a message failed: the flow cannot end; the wait runs out
      wait.pause([&] { return all.unfinished(); });
      continue;
    }
    if (count == 0 || count == MPI_UNDEFINED) {
      if (flow.step()) {  // local work done: the wait's backoff starts again
        wait.progressed();
        post();
      } else if (active) {
        wait.pause([&] { return all.unfinished(); });
      } else {
        return;
      }
      continue;
    }
    wait.progressed();
    active -= static_cast<std::size_t>(count);
    for (int k = 0; k < count; ++k) flow.completed(static_cast<std::size_t>(completed[k]));
    post();
  }
}

persistent_messages::persistent_messages(MPI_Comm comm, std::span<const peer_buffer> recvs,
                                         std::span<const peer_buffer> sends) {
  auto add = [&](const peer_buffer& b, bool receive) {
    MPI_Request r;
    if (receive)
      MPI_Recv_init(b.data, byte_count(b.bytes), MPI_BYTE, b.peer, b.tag, comm, &r);
    else
      MPI_Send_init(b.data, byte_count(b.bytes), MPI_BYTE, b.peer, b.tag, comm, &r);
    requests_.push_back(r);
    peers_.push_back(b.peer);
  };
  try {
    for (const peer_buffer& b : recvs) add(b, true);
    for (const peer_buffer& b : sends) add(b, false);
  } catch (...) {  // a count past MPI's limit: the requests made so far go
    free_all();
    throw;
  }
}

persistent_messages::~persistent_messages() {
  free_all();
}

void persistent_messages::free_all() noexcept {
  if (!mpi_finalized()) free_requests(requests_);
  requests_.clear();
}

void persistent_messages::start() {
  if (!requests_.empty()) MPI_Startall(static_cast<int>(requests_.size()), requests_.data());
}

bool persistent_messages::test() {
  return all_done(requests_);
}

void persistent_messages::wait(int rank, const message_round_options& options) {
  wait_requests(requests_, [&](std::size_t i) { return peers_[i]; }, rank, options);
}

namespace {

// MPI's int of a subarray's extent.
int subarray_int(std::uint64_t n) {
  if (n > static_cast<std::uint64_t>(std::numeric_limits<int>::max()))
    throw usage_error("zcoll: an array extent of " + std::to_string(n) +
                      " exceeds MPI's count limit between nodes");
  return static_cast<int>(n);
}

}  // namespace

owned_types::~owned_types() {
  if (mpi_finalized()) return;
  for (MPI_Datatype& t : types_) MPI_Type_free(&t);
}

MPI_Datatype owned_types::subarray(const peer_slab& slab) {
  const std::size_t ndim = slab.shape.size();
  std::vector<int> sizes(ndim), subsizes(ndim), starts(ndim, 0);
  for (std::size_t k = 0; k < ndim; ++k) sizes[k] = subsizes[k] = subarray_int(slab.shape[k]);
  const auto axis = static_cast<std::size_t>(slab.axis);
  subsizes[axis] = subarray_int(slab.count);
  starts[axis] = subarray_int(slab.start);
  types_.reserve(types_.size() + 1);  // before the type exists: nothing to leak if this throws
  MPI_Datatype element, type;
  MPI_Type_contiguous(subarray_int(slab.itemsize), MPI_BYTE, &element);
  MPI_Type_create_subarray(static_cast<int>(ndim), sizes.data(), subsizes.data(), starts.data(),
                           MPI_ORDER_C, element, &type);
  MPI_Type_commit(&type);
  MPI_Type_free(&element);
  types_.push_back(type);
  return type;
}

slab_messages::slab_messages(std::span<const peer_slab> recvs, std::span<const peer_slab> sends) {
  for (const peer_slab& s : recvs) blocks_.push_back({s.peer, s.tag, true, types_.subarray(s)});
  for (const peer_slab& s : sends) blocks_.push_back({s.peer, s.tag, false, types_.subarray(s)});
}

slab_messages::~slab_messages() {
  if (!mpi_finalized()) free_requests(requests_);
}

void slab_messages::post(MPI_Comm comm, void* recv, const void* send) {
  requests_.assign(blocks_.size(), MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const typed_block& b = blocks_[i];
    if (b.receive)
      MPI_Irecv(recv, 1, b.type, b.peer, b.tag, comm, &requests_[i]);
    else
      MPI_Isend(send, 1, b.type, b.peer, b.tag, comm, &requests_[i]);
  }
}

bool slab_messages::test() {
  return all_done(requests_);
}

void slab_messages::wait(int rank, const message_round_options& options) {
  wait_requests(requests_, [&](std::size_t i) { return blocks_[i].peer; }, rank, options);
}

namespace {

// Throws peer_error when an MPI call that starts a collective failed (a dead peer, under MPIs
// that report it).
void check_started(int rc, const char* call, int rank, const message_round_options& options) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw peer_error("zcoll: rank " + std::to_string(rank) + ": " + options.what + ": " + call +
                   " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

// Waits for one collective's request within `options`' bounds. One that gives up leaves the
// request unfreed: MPI forbids freeing a collective's, and it may still write its buffers.
void wait_collective(MPI_Request request, int rank, const message_round_options& options) {
  std::vector<MPI_Request> requests{request};
  wait_requests(requests, [](std::size_t) { return -1; }, rank, options);
}

}  // namespace

int agree_min(MPI_Comm comm, int code, int rank, const message_round_options& options) {
  // On the heap: where the wait gives up, MPI may still write them, so they are let go.
  auto codes = std::make_unique<std::array<int, 2>>(std::array<int, 2>{code, 0});
  MPI_Request request = MPI_REQUEST_NULL;
  check_started(MPI_Iallreduce(&(*codes)[0], &(*codes)[1], 1, MPI_INT, MPI_MIN, comm, &request),
                "MPI_Iallreduce", rank, options);
  try {
    wait_collective(request, rank, options);
  } catch (...) {
    static_cast<void>(codes.release());
    throw;
  }
  return (*codes)[1];
}

collective_transpose::collective_transpose(int size, std::size_t itemsize,
                                           std::span<const std::uint64_t> shape_a, int axis_a,
                                           std::span<const std::uint64_t> shape_b, int axis_b)
    : size_(size), itemsize_(itemsize) {
  arrays_[0] = blocks_of(shape_a, axis_a);
  arrays_[1] = blocks_of(shape_b, axis_b);
}

collective_transpose::blocks collective_transpose::blocks_of(std::span<const std::uint64_t> shape,
                                                             int axis) {
  blocks out;
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  for (int r = 0; r < size_; ++r) {
    const axis_share share = block_share(shape[static_cast<std::size_t>(axis)], size_, r);
    out.displacements.push_back(0);  // the subarray types hold the offsets
    if (share.count == 0 || empty) {
      out.counts.push_back(0);
      out.types.push_back(MPI_BYTE);
      continue;
    }
    peer_slab slab{r, 0, {shape.begin(), shape.end()}, axis, share.start, share.count, itemsize_};
    out.counts.push_back(1);
    out.types.push_back(types_.subarray(slab));
  }
  return out;
}

void collective_transpose::run(MPI_Comm comm, int side, const void* send, void* recv, int rank,
                               const message_round_options& options) {
  const blocks& out = arrays_[static_cast<std::size_t>(side)];
  const blocks& in = arrays_[static_cast<std::size_t>(1 - side)];
  MPI_Request request = MPI_REQUEST_NULL;
  check_started(
      MPI_Ialltoallw(send, out.counts.data(), out.displacements.data(), out.types.data(), recv,
                     in.counts.data(), in.displacements.data(), in.types.data(), comm, &request),
      "MPI_Ialltoallw", rank, options);
  wait_collective(request, rank, options);
}

}  // namespace zcoll
