// The registry: names by code, parsing, and the tuned collectives' rule tables.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "zcoll/registry.hpp"

using namespace zcoll;

TEST_CASE("every enum's names round-trip through parse_name, in code order") {
  CHECK(name_of(block_order::row) == "row");
  CHECK(name_of(block_order::hilbert) == "hilbert");
  CHECK(name_of(copy_mode::hybrid) == "hybrid");
  CHECK(name_of(copy_isa::avx512) == "avx512");
  CHECK(name_of(barrier_kind::dissemination) == "dissemination");
  CHECK(name_of(schedule_kind::offdiagonal) == "offdiagonal");
  CHECK(name_of(op_code::transfer) == "transfer");
  for (int i = 0; i < count_of<block_order>; ++i)
    CHECK(parse_name<block_order>(name_of(static_cast<block_order>(i))) ==
          static_cast<block_order>(i));
  for (int i = 0; i < count_of<op_code>; ++i)
    CHECK(parse_name<op_code>(name_of(static_cast<op_code>(i))) == static_cast<op_code>(i));
  CHECK_FALSE(parse_name<block_order>("zigzag").has_value());
  CHECK_FALSE(parse_name<block_order>(auto_name).has_value());  // "auto" is not an order
  CHECK_FALSE(parse_name<copy_mode>("").has_value());
}

TEST_CASE("counts and codes") {
  CHECK(count_of<block_order> == 5);
  CHECK(count_of<copy_mode> == 3);
  CHECK(count_of<copy_isa> == 4);
  CHECK(count_of<barrier_kind> == 3);
  CHECK(is_code<block_order>(0));
  CHECK(is_code<block_order>(4));
  CHECK_FALSE(is_code<block_order>(5));
  CHECK_FALSE(is_code<block_order>(auto_order));
  CHECK_FALSE(is_code<block_order>(eager_order));
  CHECK_FALSE(is_code<copy_mode>(auto_copy));
  CHECK(auto_order != eager_order);
}

TEST_CASE("joined_names lists every name in order") {
  CHECK(joined_names<block_order>("|") == "row|column|morton|hilbert|numa");
  CHECK(joined_names<copy_mode>(", ") == "temporal, streaming, hybrid");
}

TEST_CASE("tuned collectives have rule tables 0..n-1, others none") {
  CHECK(tuned_index(op_code::alltoall) == 0);
  CHECK(tuned_index(op_code::allgather) == 1);
  CHECK(tuned_index(op_code::transfer) == no_rules);
  CHECK(tuned_index(op_code::barrier) == no_rules);
}
