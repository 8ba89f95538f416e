#!/bin/bash
# Plain buffers receiving 8-16 KiB per rank at P = 2 (docs/performance.md, "Heap look-ups memoised; ..."):
# the default rule against CMA at every size (ZCOLL_CMA_BYTES=0) and the slots (ZCOLL_EAGER_BYTES=16384).
cd "$(dirname "$0")/../.." && export PYTHONWARNINGS=ignore
for call in alltoall allgather alltoallv neighbor_alltoall "alltoall --persistent"; do
  for cfg in "DEFAULT_RULE=1" "ZCOLL_CMA_BYTES=0" "ZCOLL_EAGER_BYTES=16384"; do
    for i in 1 2; do
      echo "== $call, $cfg, launch $i"
      env $cfg mpiexec --allow-run-as-root --oversubscribe -n 2 python3 -m zcoll.bench $call --orders auto --buffers numpy --sizes 4K,5K,6K,7K,8K 2>&1 | grep -E "^ +[0-9]+ [KM]?i?B +[0-9.]+ +[0-9.]+ "
    done
  done
done
