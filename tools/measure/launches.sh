#!/bin/bash
# launches.sh CALL BUFFERS SIZES N [P]: N launches of zcoll.bench, per-size ratios and their geomean
call=$1; buf=$2; sizes=$3; n=$4; P=${5:-2}
if [ -n "${VENV:-}" ]; then . "$VENV/bin/activate"; fi  # else the python3 on PATH
export OMPI_MCA_mpi_yield_when_idle=1
for i in $(seq $n); do
  mpiexec --allow-run-as-root --oversubscribe -n $P python -m zcoll.bench $call --orders auto --buffers $buf --sizes $sizes 2>&1 \
   | grep -E "^ +[0-9.]+ [KMG]?i?B +[0-9.]+ +[0-9.]+ +[a-z]+ +[0-9.]+x"
done | awk '{k=$1" "$2; r=$6; sub("x","",r); s[k]+=log(r); c[k]++; l[k]=l[k]" "r; if(!(k in o)){o[k]=++m; key[m]=k}} END{for(i=1;i<=m;i++){k=key[i]; printf "%-9s geomean %.2f  runs:%s\n", k, exp(s[k]/c[k]), l[k]}}'
