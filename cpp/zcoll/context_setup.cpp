#include "zcoll/context_setup.hpp"

#include "zcoll/aggregate.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/pool.hpp"

namespace zcoll {

std::shared_ptr<node_context> open_context(node_pool& pool, int index, const context_setup& setup,
                                           std::shared_ptr<pool_arena> arena) {
  auto [control, eager] = pool.open(index);
  auto ctx = std::make_shared<node_context>(std::move(control), setup.config);
  ctx->use_eager(std::move(eager), pool.layout().eager_partition(), setup.eager_bytes);
  if (setup.copy_threshold) ctx->policy().copy().set_threshold(*setup.copy_threshold);
  if (setup.copy_cache) ctx->policy().copy().set_cache_bytes(*setup.copy_cache);
  if (setup.cma_bytes) ctx->policy().set_cma_bytes(*setup.cma_bytes);
  if (!setup.node_of.empty()) ctx->between_nodes(node_map::from_leaders(setup.node_of));
  if (setup.cma) ctx->adopt_cma(setup.cma->first, setup.cma->second);
  if (arena) ctx->use_pool_arena(std::move(arena));
  return ctx;
}

}  // namespace zcoll
