#include "zcoll/checks.hpp"

#include <sstream>

#include "zcoll/reduce_kernels.hpp"

namespace zcoll {

local_check type_error(std::string message) {
  return {arg_error::type, std::move(message), 0};
}
local_check value_error(std::string message) {
  return {arg_error::value, std::move(message), 0};
}

std::string dtype_text(const dtype_id& d) {
  std::ostringstream out;
  out << "'" << static_cast<char>(d.kind) << "' (" << d.itemsize << " bytes)";
  return out.str();
}

std::string order_text(int order) {
  return std::string(is_code<block_order>(order) ? name_of(static_cast<block_order>(order))
                                                 : auto_name);
}

namespace {

std::string elements_text(std::size_t n) {
  return std::to_string(n) + (n == 1 ? " element" : " elements");
}

// Why `a` cannot be cut into `p` blocks along its first axis (or a 1-D split), or "".
std::string split_error(const array_view& a, int p, const char* name) {
  const auto np = static_cast<std::size_t>(p);
  if (a.ndim == 0) return std::string(name) + " must have at least one dimension";
  if (a.ndim == 1 && a.first_dim % np != 0)
    return std::string(name) + " has " + elements_text(a.first_dim) +
           ", which is not divisible by comm.size=" + std::to_string(p);
  if (a.ndim > 1 && a.first_dim != np)
    return std::string(name) + ".shape[0] must equal comm.size=" + std::to_string(p) + ", got " +
           std::to_string(a.first_dim);
  return {};
}

std::string dtype_short(const dtype_id& d) {
  return std::string(1, static_cast<char>(d.kind)) + std::to_string(d.itemsize);
}

bool overlap(const array_view& a, const array_view& b) noexcept {
  const auto* pa = static_cast<const std::byte*>(a.data);
  const auto* pb = static_cast<const std::byte*>(b.data);
  return a.nbytes && b.nbytes && pa < pb + b.nbytes && pb < pa + a.nbytes;
}

constexpr const char* objects_message =
    "arrays of Python objects cannot be exchanged through shared memory";

std::string shape_text(const std::int64_t* shape, int ndim) {
  std::string t = "(";
  for (int k = 0; k < ndim; ++k) t += (k ? ", " : "") + std::to_string(shape[k]);
  return t + (ndim == 1 ? ",)" : ")");
}

std::string extents_text(const extents& e, int ndim) {
  std::int64_t s[max_transfer_dims];
  for (int k = 0; k < ndim; ++k) s[k] = static_cast<std::int64_t>(e[static_cast<std::size_t>(k)]);
  return shape_text(s, ndim);
}

std::string check_transfer_array(const array_view& a, const char* name, const extents& want,
                                 int ndim) {
  if (a.has_objects) return objects_message;
  if (!a.c_contiguous) return std::string(name) + " must be C-contiguous";
  bool same = a.ndim == ndim;
  for (int k = 0; same && k < ndim; ++k)
    same = static_cast<std::uint64_t>(a.shape[k]) == want[static_cast<std::size_t>(k)];
  if (!same)
    return std::string(name) + " has shape " + shape_text(a.shape, a.ndim) +
           ", this rank's part of the distributed array has shape " + extents_text(want, ndim);
  return {};
}

// Python's repr of a list of names: ['row', 'column'].
template <class Enum>
std::string name_list() {
  return "['" + joined_names<Enum>("', '") + "']";
}

}  // namespace

local_check check_local_args(op_code op, int comm_size, const array_view* send,
                             const array_view& recv) {
  const auto p = static_cast<std::size_t>(comm_size);
  if (recv.has_objects || (send && send->has_objects)) return type_error(objects_message);
  if (!recv.c_contiguous) return value_error("recvbuf must be C-contiguous");
  if (!recv.writeable) return value_error("recvbuf is read-only");
  if (auto e = split_error(recv, comm_size, "recvbuf"); !e.empty()) return value_error(e);
  if (!send) return {arg_error::none, {}, recv.nbytes / p};
  if (!(send->dtype == recv.dtype))
    return type_error("recvbuf dtype (" + dtype_short(recv.dtype) +
                      ") differs from sendbuf dtype (" + dtype_short(send->dtype) + ")");
  const std::size_t want = op == op_code::alltoall ? send->size : p * send->size;
  if (recv.size != want)
    return value_error("recvbuf has " + elements_text(recv.size) + ", expected " +
                       elements_text(want));
  if (op == op_code::alltoall)
    if (auto e = split_error(*send, comm_size, "sendbuf"); !e.empty()) return value_error(e);
  if (overlap(*send, recv))
    return value_error("sendbuf and recvbuf overlap; pass zcoll.IN_PLACE as sendbuf instead");
  return {arg_error::none, {}, op == op_code::alltoall ? send->nbytes / p : send->nbytes};
}

local_check check_transfer_args(const transfer_geometry& g, int comm_rank, const array_view& send,
                                const array_view& recv) {
  if (auto e = g.invalid(); !e.empty()) return value_error(e);
  if (!(send.dtype == recv.dtype))
    return type_error("the arrays' dtypes differ (" + dtype_short(send.dtype) + " and " +
                      dtype_short(recv.dtype) + ")");
  if (send.dtype.itemsize != g.itemsize)
    return type_error("the arrays' itemsize " + std::to_string(send.dtype.itemsize) +
                      " differs from the transfer's " + std::to_string(g.itemsize));
  if (auto e = check_transfer_array(send, "the source array", g.shape_a(comm_rank), g.ndim);
      !e.empty())
    return value_error(e);
  if (auto e = check_transfer_array(recv, "the destination array", g.shape_b(comm_rank), g.ndim);
      !e.empty())
    return value_error(e);
  if (!recv.writeable) return value_error("the destination array is read-only");
  if (overlap(send, recv)) return value_error("the source and destination arrays overlap");
  return {arg_error::none, {}, send.nbytes / static_cast<std::size_t>(g.comm_size)};
}

local_check check_transfer_side(const transfer_geometry& g, int comm_rank, const array_view& a,
                                bool source, const dtype_id& dtype) {
  const char* name = source ? "the source array" : "the destination array";
  if (a.has_objects) return type_error(objects_message);
  if (!(a.dtype == dtype))
    return type_error(std::string(name) + " has dtype " + dtype_short(a.dtype) +
                      ", the plan's arrays have dtype " + dtype_short(dtype));
  const extents want = source ? g.shape_a(comm_rank) : g.shape_b(comm_rank);
  if (auto e = check_transfer_array(a, name, want, g.ndim); !e.empty()) return value_error(e);
  if (!source && !a.writeable) return value_error("the destination array is read-only");
  return {};
}

local_check check_reduction_args(op_code op, int comm_size, int comm_rank, const array_view* send,
                                 const array_view* recv, int reduce, int algorithm, int root) {
  const bool rooted = op == op_code::reduce || op == op_code::bcast;
  if (rooted && (root < 0 || root >= comm_size))
    return value_error("root must be a rank of the communicator (0 <= root < " +
                       std::to_string(comm_size) + "), got " + std::to_string(root));
  if (op == op_code::bcast) {
    if (!recv) return value_error("buf is missing");
    if (recv->has_objects) return type_error(objects_message);
    if (!recv->c_contiguous) return value_error("buf must be C-contiguous");
    if (!recv->writeable && comm_rank != root) return value_error("buf is read-only");
    return {arg_error::none, {}, recv->nbytes};
  }
  const array_view* input = send ? send : recv;
  if (!input) return value_error("IN_PLACE needs recvbuf, which holds the input");
  if (input->has_objects || (recv && recv->has_objects)) return type_error(objects_message);
  const auto type = element_type_of(input->dtype);
  if (!type)
    return type_error("reductions do not support dtype " + dtype_text(input->dtype) +
                      "; use bool, an integer, float16/32/64 or complex64/128");
  if (!is_code<reduce_op>(reduce)) return value_error("unknown op code " + std::to_string(reduce));
  const auto rop = static_cast<reduce_op>(reduce);
  if (!op_defined(rop, *type))
    return type_error("op '" + std::string(name_of(rop)) + "' is not defined for dtype " +
                      std::string(name_of(*type)));
  if (algorithm != auto_algorithm && !is_code<reduce_algorithm>(algorithm))
    return value_error("unknown algorithm code " + std::to_string(algorithm));
  const bool wants_result = op != op_code::reduce || comm_rank == root || !send;
  const auto p = static_cast<std::size_t>(comm_size);
  if (op == op_code::reduce_scatter && input->size % p != 0)
    return value_error(std::string(send ? "sendbuf" : "recvbuf") + " has " +
                       elements_text(input->size) +
                       ", which is not divisible by comm.size=" + std::to_string(comm_size));
  if (!wants_result) return {arg_error::none, {}, input->nbytes};
  if (!recv) return value_error("recvbuf is missing");
  if (!recv->c_contiguous) return value_error("recvbuf must be C-contiguous");
  if (!recv->writeable) return value_error("recvbuf is read-only");
  if (send) {
    if (!(send->dtype == recv->dtype))
      return type_error("recvbuf dtype (" + dtype_short(recv->dtype) +
                        ") differs from sendbuf dtype (" + dtype_short(send->dtype) + ")");
    const std::size_t want = op == op_code::reduce_scatter ? send->size / p : send->size;
    if (recv->size != want)
      return value_error("recvbuf has " + elements_text(recv->size) + ", expected " +
                         elements_text(want));
    if (overlap(*send, *recv))
      return value_error("sendbuf and recvbuf overlap; pass zcoll.IN_PLACE as sendbuf instead");
  }
  return {arg_error::none, {}, input->nbytes};
}

void set_code_error(local_check& check, int order, int copy, bool eager_allowed) {
  if (!check.ok()) return;
  if (!valid_order_code(order, eager_allowed))
    check = value_error("unknown order code " + std::to_string(order));
  else if (!valid_copy_code(copy))
    check = value_error("unknown copy code " + std::to_string(copy));
}

std::string bad_option_message(std::string_view what, std::string_view repr) {
  const std::string names = what == "copy" ? name_list<copy_mode>() : name_list<block_order>();
  return std::string(what) + " must be '" + std::string(auto_name) + "' or one of " + names +
         ", got " + std::string(repr);
}

}  // namespace zcoll
