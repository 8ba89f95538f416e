/*
 * Argument checks: the one place where a call's arguments are judged.
 *
 * Every entry point checks its own rank's arguments here, locally and without throwing: a rank
 * that finds an error must still take part in the call, publish the error, and let every rank
 * raise it together (see protocol.hpp). So a check returns a verdict -- the kind of error (which
 * the binding maps to TypeError or ValueError) and its message -- rather than throwing. What
 * needs the other ranks (sizes, dtypes and orders that must agree) is checked by the protocol
 * over the ranks' published calls.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zcoll/registry.hpp"
#include "zcoll/transfer.hpp"

namespace zcoll {

// Kind of a locally detected argument error; maps to a Python exception type.
enum class arg_error : std::uint8_t { none = 0, value = 1, type = 2 };

// The element type as NumPy describes it; only equality matters to the core.
struct dtype_id {
  std::uint32_t kind = 0;      // dtype.char
  std::uint32_t itemsize = 0;  // bytes
  friend bool operator==(const dtype_id&, const dtype_id&) = default;
};

// A NumPy array as the binding sees it (no Python types in the core).
struct array_view {
  const void* data = nullptr;
  std::size_t nbytes = 0;
  std::size_t size = 0;  // elements
  int ndim = 0;
  std::size_t first_dim = 0;            // shape[0]; 0 when ndim == 0
  const std::int64_t* shape = nullptr;  // ndim extents, valid during the call
  dtype_id dtype;
  bool c_contiguous = true;
  bool writeable = true;
  bool has_objects = false;
};

// Outcome of the local (this rank only) argument checks of one call.
struct local_check {
  arg_error error = arg_error::none;
  std::string message;          // why, when error != none
  std::size_t block_bytes = 0;  // bytes per block, when the arguments are fine
  bool ok() const noexcept { return error == arg_error::none; }
};

local_check type_error(std::string message);
local_check value_error(std::string message);

// Checks one rank's buffers for `op` (alltoall or allgather) on a communicator of `comm_size`
// ranks; `send` is nullptr for an in-place call.
local_check check_local_args(op_code op, int comm_size, const array_view* send,
                             const array_view& recv);

// Checks one rank's arrays for a transfer of geometry `g` as rank `comm_rank`: `send` aligned in
// axis a, `recv` aligned in axis b, both C-contiguous with the local shapes `g` implies.
local_check check_transfer_args(const transfer_geometry& g, int comm_rank, const array_view& send,
                                const array_view& recv);

// Checks an array that stands in, for one run of a transfer plan, for rank `comm_rank`'s source
// (`source`: aligned in axis a) or destination array (aligned in axis b): the plan's dtype
// `dtype`, the local shape `g` implies, C-contiguous, and writeable for a destination.
local_check check_transfer_side(const transfer_geometry& g, int comm_rank, const array_view& a,
                                bool source, const dtype_id& dtype);

// Checks one rank's arguments to a call of the reduction family (`op`: allreduce, reduce,
// reduce_scatter or bcast) as communicator rank `comm_rank` of `comm_size`. `send` is nullptr
// in place (`recv` holds this rank's input); `recv` may be nullptr where no result is wanted
// (reduce off the root). For bcast, `recv` is the buffer and `send` nullptr. `reduce` is a
// reduce_op code, `algorithm` a reduce_algorithm code or auto_algorithm, `root` a communicator
// rank (reduce, bcast). The verdict's block_bytes is the bytes of this rank's input.
local_check check_reduction_args(op_code op, int comm_size, int comm_rank, const array_view* send,
                                 const array_view* recv, int reduce, int algorithm, int root);

// Sets `check` to "unknown order/copy code" when `order` is not a block_order value or
// auto_order (with `eager_allowed`, eager_order too) or `copy` not a copy_mode value or
// auto_copy, unless it holds an error already. Returns check.ok(). Inline: every call runs it.
inline bool valid_order_code(int order, bool eager_allowed) noexcept {
  return order == auto_order || is_code<block_order>(order) ||
         (eager_allowed && order == eager_order);
}
inline bool valid_copy_code(int copy) noexcept {
  return copy == auto_copy || is_code<copy_mode>(copy);
}
void set_code_error(local_check& check, int order, int copy, bool eager_allowed);
inline bool check_codes(local_check& check, int order, int copy, bool eager_allowed) {
  if (check.ok() && valid_order_code(order, eager_allowed) && valid_copy_code(copy)) return true;
  set_code_error(check, order, copy, eager_allowed);
  return check.ok();
}

// The message for an `order=` or `copy=` value (its Python repr) that names no order or mode:
// "order must be 'auto' or one of ['row', ...], got 'zigzag'". `what` is "order" or "copy".
std::string bad_option_message(std::string_view what, std::string_view repr);

// How messages show a dtype: 'd' (8 bytes).
std::string dtype_text(const dtype_id& d);

// How messages name an order code: the eager path is what "auto" chose.
std::string order_text(int order);

}  // namespace zcoll
