#!/usr/bin/env bash
# zcoll's benchmarks on a lent 16-core machine (tools/device/README.md): zcoll against the MPI
# library in the same job, at P = 8 and 16 on real cores. Not CI. Reads the bundle that
# tools/device/make-bundle.sh leaves in .devbundle (carried); writes $OUT/results.tgz and a
# summary. Usage: tools/device/bench.sh STEP... (default: every step, in priority order).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/.devbundle
prefix=${ZCOLL_DEVICE_PREFIX:-/tmp/pfx}
out=${OUT:-/tmp/device-out}
results=$out/r
mkdir -p "$results"

python3 -m pip install -q --no-index --no-deps --no-compile --prefix "$prefix" "$bundle"/*.whl || exit 1
pyver=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
export PATH=$prefix/bin:$PATH
export PYTHONPATH=$prefix/lib/python$pyver/site-packages
export LD_LIBRARY_PATH=$prefix/lib:$bundle/lib
ldconfig -p | grep -q libudev.so.1 || LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$bundle/fallback
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
cd "$results" || exit 1

run() {  # run NAME SECONDS RANKS ARGS...: mpiexec with a wall-clock limit, log kept and summarised
    local name=$1 limit=$2 ranks=$3 start=$SECONDS
    shift 3
    ranks=$(( ranks > ${RANKS_CAP:-64} ? ${RANKS_CAP:-64} : ranks ))  # RANKS_CAP: a smoke run here
    local bind=(--bind-to core)
    [ -n "${RANKS_CAP:-}" ] && bind=(--oversubscribe --bind-to none)
    timeout -k 5 "$limit" mpiexec -n "$ranks" --map-by core "${bind[@]}" \
        python3 "$@" > "$name.log" 2>&1
    local rc=$?
    printf '== %s: rc %d, %d s\n' "$name" "$rc" $((SECONDS - start))
    grep -a -E "^ *[0-9.]+[KMG]?i?B? |speedup|x$|geomean|Error|error" "$name.log" | tail -n "${TAIL:-14}"
    tar czf "$out/results.tgz" -C "$results" . 2>/dev/null
}

bench() { local name=$1 ranks=$2; shift 2; run "$name" "${LIMIT:-120}" "$ranks" -m zcoll.bench "$@" \
    --no-progress --json "$name.json"; }

step_info() {
    { nproc; lscpu; ls /sys/devices/system/node; python3 -c 'import mpi4py, numpy; print(mpi4py.__version__, numpy.__version__)'; } > info.log 2>&1
    head -n 30 info.log | grep -E "^[0-9]+$|Model name|Socket|NUMA|L[123]|node|^[0-9.]+ [0-9.]+$"
    run topology 60 16 -c 'from mpi4py import MPI; import zcoll; t = zcoll.topology(MPI.COMM_WORLD); print(t) if MPI.COMM_WORLD.rank == 0 else None; print(MPI.Get_library_version().splitlines()[0]) if MPI.COMM_WORLD.rank == 0 else None'
    grep -a . topology.log | head -n 40
}
step_reductions() {
    for p in 8 16 2; do
        bench allreduce_p$p $p allreduce --sizes 8,64,1K,16K,64K,1M,16M --time-budget 0.2 --check
    done
    for p in 8 16; do bench barrier_p$p $p barrier; bench bcast_p$p $p bcast --sizes 8,1K,64K,1M,16M --time-budget 0.2; done
}
step_nodes() {
    bench xn_alltoall_p8 8 alltoall --virtual-node-size 2 --between-nodes --sizes 8,64,1K,16K,64K --orders auto --time-budget 0.2 --check
    bench xn_alltoall_p16 16 alltoall --virtual-node-size 4 --between-nodes --sizes 8,1K,16K --orders auto --time-budget 0.2
    bench xn_allgather_p16 16 allgather --virtual-node-size 4 --between-nodes --sizes 8,512,4K,32K,64K,128K --orders auto --time-budget 0.2
    # plain NumPy buffers: each rank packs its own blocks across nodes, no staging (session 13)
    bench xn_numpy_p8 8 alltoall --virtual-node-size 2 --between-nodes --buffers numpy --sizes 8,1K,8K,16K,64K --orders auto --time-budget 0.2 --check
    bench xn_allgather_p8 8 allgather --virtual-node-size 2 --between-nodes --sizes 8,1K,16K,32K,64K --orders auto --time-budget 0.2 --check
    for p in 8 16; do  # reductions and bcast whole in the round within their rules (session 13),
        # spread over the ranks beyond them (session 14)
        bench xn_allreduce_p$p $p allreduce --virtual-node-size $((p / 4)) --sizes 8,1K,16K,64K,256K,1M,16M --time-budget 0.2 --check
        bench xn_reduce_p$p $p reduce --virtual-node-size $((p / 4)) --sizes 8,64K,1M,16M --time-budget 0.2 --check
        bench xn_bcast_p$p $p bcast --virtual-node-size $((p / 4)) --sizes 8,1K,16K,64K,256K,1M,16M --time-budget 0.2
    done
    for p in 8 16; do  # the irregular calls: counts and small blocks in the round (session 12)
        bench xn_alltoallv_p$p $p alltoallv --virtual-node-size $((p / 4)) --between-nodes \
            --sizes 8,1K,4K,16K,64K --orders auto --time-budget 0.2 --check
    done
}
step_alltoall() {
    for p in 8 16; do
        bench alltoall_p$p $p alltoall --sizes 8,64,1K,16K,256K,1M --orders row,morton,hilbert,numa,auto --time-budget 0.2 --check
    done
}
step_fft() {  # pyFFTW on both sides, each with its default planner effort (FFTW_ESTIMATE)
    for p in 8 16; do
        bench fft_p$p $p fft --sizes 128,256 --backend pyfftw --mpi4py-fft-backend pyfftw --check
    done
}

step_tuned() {  # the reductions' cost models measured here (zcoll.tune), then auto against them
    export ZCOLL_TUNING_FILE=$results/tuning.json
    for p in 2 8 16; do
        run tune_p$p 120 $p -m zcoll.tune --collectives allreduce --time-budget 0.05 \
            --reduction-sizes 8,64,512,1K,4K,16K,64K,256K,1M,4M,16M
        bench tuned_allreduce_p$p $p allreduce --sizes 8,64,1K,16K,64K,1M,16M --time-budget 0.2
    done
    unset ZCOLL_TUNING_FILE
}
step_fftw() {  # both libraries on the same FFTW (the distribution's, through mpi4py_fft.fftw)
    for p in 2 8 16; do bench fftw_p$p $p fft --sizes 128,256 --backend fftw; done
}
step_senders() {  # the messages between virtual nodes, from C++
    bench xn_cpp 8 alltoall --virtual-node-size 2 --between-nodes \
        --sizes 8,1K,16K --orders auto --time-budget 0.2
}
step_fresh() {  # reductions on input rewritten before each call: built-in models, then tuned ones
    for p in 2 8 16; do
        bench fresh_allreduce_p$p $p allreduce --method fresh --sizes 8,64,1K,16K,64K,1M,16M --time-budget 0.1
    done
    export ZCOLL_TUNING_FILE=$results/tuning_fresh.json
    for p in 8 16; do
        run tune_fresh_p$p 120 $p -m zcoll.tune --collectives allreduce --time-budget 0.05 \
            --reduction-sizes 8,64,512,1K,4K,16K,64K,256K,1M,4M,16M
        bench tuned_fresh_p$p $p allreduce --method fresh --sizes 8,64,1K,16K,64K,1M,16M --time-budget 0.1
    done
    unset ZCOLL_TUNING_FILE
}
step_packs() {  # aggregated messages packed by their sender alone or in shares, across 16 KiB
    bench packs_p8 8 alltoall --virtual-node-size 2 --between-nodes --sizes 1K,2K,4K,8K,16K --orders auto --time-budget 0.2
    bench packs_p16 16 alltoall --virtual-node-size 4 --between-nodes --sizes 256,512,1K,2K,4K --orders auto --time-budget 0.2
}
step_tcp() {  # every MPI message over TCP (loopback), as between real nodes; zcoll's node-local
    # part stays in its arena, MPI's own alltoall pays TCP for every pair
    for p in 8 16; do
        OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self bench tcp_p$p $p alltoall --virtual-node-size $((p / 4)) \
            --between-nodes --sizes 8,1K,16K --orders auto --time-budget 0.2
        OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self bench tcp_v_p$p $p alltoallv --virtual-node-size $((p / 4)) \
            --between-nodes --sizes 8,1K,16K --orders auto --time-budget 0.2
        OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self bench tcp_ag_p$p $p allgather --virtual-node-size $((p / 4)) \
            --between-nodes --sizes 8,1K,16K --orders auto --time-budget 0.2
        OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self bench tcp_ar_p$p $p allreduce --virtual-node-size $((p / 4)) \
            --sizes 8,1K,16K,64K --time-budget 0.2
    done
}
step_spread() {  # reductions and bcast spread over the ranks (sessions 15-16): the default
    # segments (phase 1, the transfers, the fold and phase 3 overlap) against one segment per piece
    for k in 8 4; do
        for seg in 512K 1G; do
            bench spread_ar_k${k}_$seg 16 allreduce --virtual-node-size $k --algorithms auto \
                --sizes 1M,4M,16M --time-budget 0.2 --spread-segment $seg
            bench spread_bc_k${k}_$seg 16 bcast --virtual-node-size $k --algorithms auto \
                --sizes 1M,4M,16M --time-budget 0.2 --spread-segment $seg
        done
    done
}
step_tests() {  # the collectives' and reductions' tests at P = 16, never run in CI (2 cores)
    local start=$SECONDS
    timeout -k 5 "${LIMIT_TESTS:-200}" python3 "$here/tests/run_mpi.py" -n "${TEST_RANKS:-16}" --no-virtual-nodes \
        -- "$here/tests/test_collectives.py" "$here/tests/test_reductions.py" -q -x -p no:cacheprovider > tests.log 2>&1
    printf '== tests: rc %d, %d s\n' $? $((SECONDS - start))
    grep -a -E "passed|failed|error" tests.log | tail -n 6
    tar czf "$out/results.tgz" -C "$results" . 2>/dev/null
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(info reductions nodes alltoall fft tests)
for s in "${steps[@]}"; do start=$SECONDS; "step_$s"; echo "== step $s: $((SECONDS - start)) s"; done
