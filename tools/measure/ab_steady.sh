#!/bin/bash
# A/B of two installs in alternating launches: OLD and NEW are virtual environments
# (default /work/venv-b and /work/venv-main); each prints the rows of docs/performance.md.
export OMPI_MCA_mpi_yield_when_idle=1
for round in 1 2; do
  for v in ${OLD:-/work/venv-b} ${NEW:-/work/venv-main}; do
    . $v/bin/activate
    echo "== $v round $round"
    mpiexec --allow-run-as-root -n 2 python -m zcoll.bench alltoall --orders auto --sizes 8,1M --time-budget 0.3 2>&1 | grep -E "^ +(8 B|1 MiB) +[0-9.]+ +[0-9.]+ +auto"
    mpiexec --allow-run-as-root --oversubscribe -n 4 python -m zcoll.bench allreduce --virtual-node-size 2 --sizes 8,64K,1M --time-budget 0.3 2>&1 | grep -E "^ +[0-9.]+ [KM]?i?B " | awk '{print "allreduce vn2", $1, $2, "MPI", $3, "zcoll", $4}'
    mpiexec --allow-run-as-root -n 2 python -m zcoll.bench fft --sizes 256 --rounds 3 2>&1 | grep -E "^ *256" | head -3
  done
done
