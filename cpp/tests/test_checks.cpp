// Argument checks (checks.hpp) and the verdict over the ranks' calls (protocol.hpp's agree):
// the messages and exception types every rank raises, without MPI or Python.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "zcoll/error.hpp"
#include "zcoll/protocol.hpp"

using namespace zcoll;

namespace {

constexpr dtype_id f8{'d', 8};
constexpr dtype_id f4{'f', 4};

// A C-contiguous, writable array view over `data` with `shape`.
struct test_array {
  std::vector<std::byte> data;
  std::vector<std::int64_t> shape;
  array_view view;
  test_array(std::vector<std::int64_t> dims, dtype_id dt) : shape(std::move(dims)) {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    data.resize(n * dt.itemsize + 1);
    view.data = data.data();
    view.size = n;
    view.nbytes = n * dt.itemsize;
    view.ndim = static_cast<int>(shape.size());
    view.first_dim = shape.empty() ? 0 : static_cast<std::size_t>(shape[0]);
    view.shape = shape.data();
    view.dtype = dt;
  }
};

call_record collective(op_code op, std::uint64_t block, dtype_id dt = f8, int order = 0,
                       bool in_place = false) {
  call_record r;
  r.call.op = op;
  r.call.block_bytes = block;
  r.call.dtype = dt;
  r.call.order = static_cast<std::int8_t>(order);
  r.call.flag = in_place ? 1 : 0;
  return r;
}

template <class Error>
std::string message_of(const std::vector<call_record>& records, op_code expected) {
  try {
    agree(records, expected);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("check_local_args accepts matching buffers and reports the block size") {
  test_array send({4, 3}, f8), recv({4, 3}, f8);
  local_check c = check_local_args(op_code::alltoall, 4, &send.view, recv.view);
  CHECK(c.ok());
  CHECK(c.block_bytes == 3 * 8);
  test_array one({3}, f8);
  c = check_local_args(op_code::allgather, 4, &one.view, recv.view);
  CHECK(c.ok());
  CHECK(c.block_bytes == 3 * 8);
  c = check_local_args(op_code::alltoall, 4, nullptr, recv.view);  // in place
  CHECK(c.ok());
  CHECK(c.block_bytes == 3 * 8);
}

TEST_CASE("check_local_args names what is wrong, with its error type") {
  test_array send({4, 3}, f8), recv({4, 3}, f8), small({4, 2}, f8), floats({4, 3}, f4);
  local_check c = check_local_args(op_code::alltoall, 4, &send.view, floats.view);
  CHECK(c.error == arg_error::type);
  CHECK(c.message == "recvbuf dtype (f4) differs from sendbuf dtype (d8)");
  c = check_local_args(op_code::alltoall, 4, &send.view, small.view);
  CHECK(c.error == arg_error::value);
  CHECK(c.message == "recvbuf has 8 elements, expected 12 elements");
  c = check_local_args(op_code::alltoall, 3, &send.view, recv.view);
  CHECK(c.message == "recvbuf.shape[0] must equal comm.size=3, got 4");
  test_array odd({7}, f8);
  c = check_local_args(op_code::alltoall, 2, nullptr, odd.view);
  CHECK(c.message == "recvbuf has 7 elements, which is not divisible by comm.size=2");
  recv.view.writeable = false;
  c = check_local_args(op_code::alltoall, 4, &send.view, recv.view);
  CHECK(c.message == "recvbuf is read-only");
  c = check_local_args(op_code::alltoall, 4, &recv.view, recv.view);
  CHECK(c.message == "recvbuf is read-only");
  send.view.has_objects = true;
  c = check_local_args(op_code::alltoall, 4, &send.view, small.view);
  CHECK(c.error == arg_error::type);
}

TEST_CASE("overlapping send and receive buffers are refused") {
  test_array both({4, 4}, f8);
  array_view send = both.view, recv = both.view;
  send.size = recv.size = 8;
  send.nbytes = recv.nbytes = 64;
  send.first_dim = recv.first_dim = 4;
  std::int64_t shape[] = {4, 2};
  send.shape = recv.shape = shape;
  recv.data = both.data.data() + 32;
  const local_check c = check_local_args(op_code::alltoall, 4, &send, recv);
  CHECK(c.message == "sendbuf and recvbuf overlap; pass zcoll.IN_PLACE as sendbuf instead");
}

TEST_CASE("check_codes takes the registry's codes and keeps an earlier error") {
  local_check ok;
  CHECK(check_codes(ok, auto_order, auto_copy, false));
  CHECK(check_codes(ok, 4, 2, false));
  local_check bad_order;
  CHECK_FALSE(check_codes(bad_order, 5, auto_copy, true));
  CHECK(bad_order.message == "unknown order code 5");
  local_check eager;
  CHECK_FALSE(check_codes(eager, eager_order, auto_copy, false));
  local_check eager_ok;
  CHECK(check_codes(eager_ok, eager_order, auto_copy, true));
  local_check bad_copy;
  CHECK_FALSE(check_codes(bad_copy, 0, 3, true));
  CHECK(bad_copy.message == "unknown copy code 3");
  local_check earlier = value_error("first");
  CHECK_FALSE(check_codes(earlier, 99, 99, true));
  CHECK(earlier.message == "first");
}

TEST_CASE("bad_option_message lists the names as Python does") {
  CHECK(bad_option_message("order", "'zigzag'") ==
        "order must be 'auto' or one of ['row', 'column', 'morton', 'hilbert', 'numa'], got "
        "'zigzag'");
  CHECK(bad_option_message("copy", "3") ==
        "copy must be 'auto' or one of ['temporal', 'streaming', 'hybrid'], got 3");
}

TEST_CASE("agree: the first rank's own error wins, with its type, on every rank") {
  std::vector<call_record> records{collective(op_code::alltoall, 8),
                                   error_record(arg_error::value, "zcoll.alltoall: bad"),
                                   error_record(arg_error::type, "zcoll.alltoall: worse")};
  CHECK(message_of<usage_error>(records, op_code::alltoall) == "[rank 1] zcoll.alltoall: bad");
  records[1] = collective(op_code::alltoall, 8);
  CHECK(message_of<type_mismatch>(records, op_code::alltoall) == "[rank 2] zcoll.alltoall: worse");
}

TEST_CASE("agree: different operations, then differing arguments") {
  std::vector<call_record> records{collective(op_code::alltoall, 8),
                                   collective(op_code::allgather, 8)};
  CHECK(message_of<usage_error>(records, op_code::alltoall) ==
        "zcoll: ranks called different operations at once: rank 0 called alltoall, rank 1 "
        "called allgather");
  records = {collective(op_code::alltoall, 8), collective(op_code::alltoall, 16)};
  CHECK(message_of<usage_error>(records, op_code::alltoall) ==
        "zcoll.alltoall: block sizes differ between ranks: rank 0 has 8 bytes per block, rank 1 "
        "has 16");
  records = {collective(op_code::alltoall, 8), collective(op_code::alltoall, 8, f4)};
  CHECK(message_of<type_mismatch>(records, op_code::alltoall) ==
        "zcoll.alltoall: dtypes differ between ranks: rank 0 has 'd' (8 bytes), rank 1 has 'f' "
        "(4 bytes)");
  records = {collective(op_code::allgather, 8), collective(op_code::allgather, 8, f8, 0, true)};
  CHECK(message_of<usage_error>(records, op_code::allgather) ==
        "zcoll.allgather: IN_PLACE must be used by all ranks or none (rank 0 and rank 1 differ)");
  records = {collective(op_code::alltoall, 8, f8, auto_order), collective(op_code::alltoall, 8)};
  CHECK(message_of<usage_error>(records, op_code::alltoall) ==
        "zcoll.alltoall: order differs between ranks: rank 0 uses 'auto', rank 1 uses 'row'");
}

TEST_CASE("agree: matching calls pass, allocations may ask for different sizes") {
  std::vector<call_record> same{collective(op_code::alltoall, 8), collective(op_code::alltoall, 8)};
  CHECK_NOTHROW(agree(same, op_code::alltoall));
  std::vector<call_record> allocs{collective(op_code::allocate, 100),
                                  collective(op_code::allocate, 7)};
  CHECK_NOTHROW(agree(allocs, op_code::allocate));
  CHECK(message_of<usage_error>(allocs, op_code::barrier) ==
        "zcoll: expected barrier, peers called an arena allocation");
}

TEST_CASE("check_transfer_side: an array that stands in for one side of a transfer plan") {
  transfer_geometry g;
  g.ndim = 3;
  g.shape = {10, 7, 6};
  g.axis_a = 2;  // source: all of axis 2, rank 1's part of axis 0 (rows 4..6 of 10 over 3)
  g.axis_b = 0;  // destination: all of axis 0, rank 1's part of axis 2 (2 of 6)
  g.itemsize = 8;
  g.comm_size = 3;
  test_array src({3, 7, 6}, f8), dst({10, 7, 2}, f8), floats({3, 7, 6}, f4), wrong({4, 7, 6}, f8);
  CHECK(check_transfer_side(g, 1, src.view, true, f8).ok());
  CHECK(check_transfer_side(g, 1, dst.view, false, f8).ok());
  local_check c = check_transfer_side(g, 1, floats.view, true, f8);
  CHECK(c.error == arg_error::type);
  CHECK(c.message == "the source array has dtype f4, the plan's arrays have dtype d8");
  c = check_transfer_side(g, 1, wrong.view, true, f8);
  CHECK(c.error == arg_error::value);
  CHECK(c.message ==
        "the source array has shape (4, 7, 6), this rank's part of the distributed array has "
        "shape (3, 7, 6)");
  c = check_transfer_side(g, 1, src.view, false, f8);  // the source's shape as a destination
  CHECK(c.error == arg_error::value);
  src.view.writeable = false;  // a read-only source is fine, a read-only destination is not
  CHECK(check_transfer_side(g, 1, src.view, true, f8).ok());
  dst.view.writeable = false;
  CHECK(check_transfer_side(g, 1, dst.view, false, f8).message ==
        "the destination array is read-only");
  dst.view.writeable = true;
  dst.view.c_contiguous = false;
  CHECK(check_transfer_side(g, 1, dst.view, false, f8).message ==
        "the destination array must be C-contiguous");
}

TEST_CASE("agree: runs of different persistent plans, and transfer plans of other geometries") {
  auto start = [](std::uint64_t id) {
    call_record r;
    r.call.op = op_code::start;
    r.call.target = op_code::transfer;
    r.call.block_bytes = id;
    return r;
  };
  std::vector<call_record> same{start(3), start(3), start(3)};
  CHECK_NOTHROW(agree(same, op_code::start));
  std::vector<call_record> different{start(3), start(3), start(4)};
  CHECK(message_of<usage_error>(different, op_code::start) ==
        "zcoll: ranks ran different persistent plans at once: rank 0 ran plan #3 (transfer), "
        "rank 2 ran plan #4 (transfer)");
  std::vector<call_record> plain{start(3), collective(op_code::transfer, 99)};
  CHECK(message_of<usage_error>(plain, op_code::start) ==
        "zcoll: ranks called different operations at once: rank 0 called a plan's run, rank 1 "
        "called transfer");
  auto planned = [](std::uint64_t signature) {
    call_record r = collective(op_code::plan, signature);
    r.call.target = op_code::transfer;
    return r;
  };
  std::vector<call_record> geometries{planned(11), planned(12)};
  CHECK(message_of<usage_error>(geometries, op_code::plan) ==
        "zcoll.transfer_init: global shapes, axes or itemsizes differ between rank 0 and rank 1");
}
