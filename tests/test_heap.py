"""The shared heap (zcoll.use_shared_heap): NumPy's memory handler on node shared memory.

Collectives on heap arrays (both sides, or one side heap and the other plain or arena) are
checked bit for bit against mpi4py's on the same data. The process semantics are NumPy's own:
a fork child's writes stay its own, threads allocate concurrently, arrays outlive MPI and the
interpreter, pickling and views behave, a NumPy workload gives the same results with the heap
on as off, memory returns and stays flat, and a request the kernel refuses is a MemoryError.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from conftest import all_ranks_agree, launcher_free_env

KIB, MIB = 1 << 10, 1 << 20
SIZES = [0, 1, 100, 3000, 70_001]  # elements per block: eager, staged-size and large calls


def heap_array(shape, dtype, seed: int) -> np.ndarray:
    with zcoll.use_shared_heap():
        a = np.empty(shape, dtype)
    a.reshape(-1).view(np.uint8)[:] = np.random.default_rng(seed).integers(
        0, 256, a.nbytes, dtype=np.uint8
    )
    return a


def make(kind: str, comm, shape, dtype, seed: int) -> np.ndarray:
    """A heap, plain or arena array of random bytes."""
    if kind == "heap":
        return heap_array(shape, dtype, seed)
    a = np.empty(shape, dtype) if kind == "plain" else zcoll.empty(comm, shape, dtype)
    a.reshape(-1).view(np.uint8)[:] = np.random.default_rng(seed).integers(
        0, 256, a.nbytes, dtype=np.uint8
    )
    return a


def byte_view(a: np.ndarray):
    return [a.reshape(-1).view(np.uint8), MPI.BYTE]


# (send kind, receive kind) of the buffers of a call.
KINDS = [("heap", "heap"), ("heap", "plain"), ("plain", "heap"), ("arena", "heap")]


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_alltoall_and_allgather_match_mpi(comm, kinds):
    p, failures = comm.size, []
    for count in SIZES:
        send = make(kinds[0], comm, (p, count), np.float64, 7 * comm.rank + count)
        recv = make(kinds[1], comm, (p, count), np.float64, 1)
        expected = np.empty_like(send)
        comm.Alltoall(byte_view(send), byte_view(expected))
        zcoll.alltoall(comm, send, recv)
        if recv.tobytes() != expected.tobytes():
            failures.append(("alltoall", count))
        gathered = make(kinds[1], comm, (p, count), np.float64, 2)
        comm.Allgather(byte_view(send[0]), byte_view(expected))
        zcoll.allgather(comm, send[0], gathered)
        if gathered.tobytes() != expected.tobytes():
            failures.append(("allgather", count))
    all_ranks_agree(comm, not failures, f"{kinds}: {failures}")


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_irregular_calls_match_mpi(comm, kinds):
    p, me, failures = comm.size, comm.rank, []
    for scale in (1, 5000):
        counts = [(me + j) % 3 * scale for j in range(p)]  # what rank me sends to rank j
        rcounts = [(j + me) % 3 * scale for j in range(p)]
        send = make(kinds[0], comm, (sum(counts),), np.int32, me + scale)
        recv = make(kinds[1], comm, (sum(rcounts),), np.int32, 3)
        expected = np.empty_like(recv)
        comm.Alltoallv([send, counts], [expected, rcounts])
        zcoll.alltoallv(comm, [send, counts], [recv, rcounts])
        if recv.tobytes() != expected.tobytes():
            failures.append(("alltoallv", scale))
        sizes = [(j % 2 + 1) * scale for j in range(p)]
        mine = send[: sizes[me]] if send.size >= sizes[me] else np.resize(send, sizes[me])
        out = make(kinds[1], comm, (sum(sizes),), np.int32, 4)
        expected = np.empty_like(out)
        comm.Allgatherv(mine, [expected, sizes])
        zcoll.allgatherv(comm, mine, [out, sizes])
        if out.tobytes() != expected.tobytes():
            failures.append(("allgatherv", scale))
    all_ranks_agree(comm, not failures, f"{kinds}: {failures}")


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_reductions_and_bcast_match_mpi(comm, kinds):
    p, failures = comm.size, []
    for n in (1, 1000, 300_000):
        x = make(kinds[0], comm, (n * p,), np.int64, comm.rank + n) % 1000
        out = make(kinds[1], comm, (n * p,), np.int64, 5)
        expected = np.empty_like(out)
        comm.Allreduce(x, expected)
        zcoll.allreduce(comm, x, out)
        if not np.array_equal(out, expected):
            failures.append(("allreduce", n))
        part = make(kinds[1], comm, (n,), np.int64, 6)
        expected = np.empty_like(part)
        comm.Reduce_scatter_block(x, expected)
        zcoll.reduce_scatter_block(comm, x, part)
        if not np.array_equal(part, expected):
            failures.append(("reduce_scatter_block", n))
        buf = make(kinds[1], comm, (n,), np.int64, 8 + comm.rank)
        root_data = buf.copy()
        comm.Bcast(root_data, root=p - 1)
        zcoll.bcast(comm, buf, root=p - 1)
        if not np.array_equal(buf, root_data):
            failures.append(("bcast", n))
    all_ranks_agree(comm, not failures, f"{kinds}: {failures}")


def test_plans_on_heap_arrays(comm):
    p = comm.size
    send = heap_array((p, 40_000), np.float64, comm.rank)
    recv = heap_array((p, 40_000), np.float64, 9)
    ok = True
    with zcoll.alltoall_init(comm, send, recv) as plan:
        for run in range(3):
            send[...] = np.arange(send.size).reshape(send.shape) + 1e6 * comm.rank + run
            expected = np.empty_like(send)
            comm.Alltoall(send, expected)
            plan()
            ok &= recv.tobytes() == expected.tobytes()
    all_ranks_agree(comm, ok, "plan on heap arrays")


def test_arrays_are_in_the_heap_only_when_on():
    with zcoll.use_shared_heap():
        big, small = np.zeros(1 << 16), np.zeros(8)
    plain = np.zeros(1 << 16)
    assert zcoll.in_heap(big) and not zcoll.in_heap(small) and not zcoll.in_heap(plain)
    assert np.all(big == 0)
    with zcoll.use_shared_heap():
        with zcoll.use_shared_heap(False):
            assert not zcoll.in_heap(np.zeros(1 << 16))
        assert zcoll.in_heap(np.zeros(1 << 16))


def rss_shmem() -> int:
    """Bytes of shared memory this process has resident (its own heap and mapped peers')."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * KIB
    raise AssertionError("no RssShmem in /proc/self/status")


def test_large_arrays_return_their_memory():
    """Freed segments beyond what the reuse cache keeps go back to the system: the heap's
    segments and this process's resident shared memory shrink again."""
    before = zcoll.heap_stats()
    with zcoll.use_shared_heap():
        arrays = [np.ones(24 * MIB // 8) for _ in range(4)]
    during, resident = zcoll.heap_stats(), rss_shmem()
    del arrays
    after = zcoll.heap_stats()
    assert during["segment_bytes"] >= before["segment_bytes"] - before["kept_bytes"] + 96 * MIB
    live = lambda s: s["segment_bytes"] - s["kept_bytes"]  # noqa: E731
    assert live(after) == live(before)
    assert after["kept_bytes"] <= 64 * MIB
    assert resident - rss_shmem() >= 24 * MIB


def test_freed_segments_are_kept_for_reuse_within_bounds():
    with zcoll.use_shared_heap():
        a = np.ones(4 * MIB // 8)
        address = a.ctypes.data
        del a
        kept = zcoll.heap_stats()["kept_bytes"]
        b = np.zeros(4 * MIB // 8)  # the kept segment again, zeroed
    assert kept >= 4 * MIB and b.ctypes.data == address and not b.any()
    assert zcoll.heap_stats()["kept_bytes"] <= 64 * MIB
    huge = zcoll.heap_stats()["huge_bytes"]
    if huge < 1 << 40:
        with zcoll.use_shared_heap():
            assert not zcoll.in_heap(np.empty(huge, np.uint8))


def test_resize_concatenate_and_views():
    with zcoll.use_shared_heap():
        a = np.arange(10_000, dtype=np.float64)
        a.resize(200_000, refcheck=False)  # realloc across size classes, then to a segment
        assert np.array_equal(a[:10_000], np.arange(10_000)) and not a[10_000:].any()
        a.resize(3_000, refcheck=False)
        assert np.array_equal(a, np.arange(3_000))
        view = np.concatenate([a, a])[1000:5000:3]
    del a
    assert np.array_equal(view, np.concatenate([np.arange(3000)] * 2)[1000:5000:3])


def test_pickle_save_and_load(tmp_path):
    with zcoll.use_shared_heap():
        a = np.random.default_rng(0).random((300, 70))
        back = pickle.loads(pickle.dumps(a))
        buf = io.BytesIO()
        np.save(buf, a)
        buf.seek(0)
        loaded = np.load(buf)
        np.save(tmp_path / "a.npy", a)
        mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert np.array_equal(back, a) and np.array_equal(loaded, a) and np.array_equal(mapped, a)


def test_numpy_workload_gives_the_same_results():
    def work() -> list[np.ndarray]:
        rng = np.random.default_rng(42)
        m = rng.random((200, 200))
        v = rng.random(50_000)
        out = [m @ m, np.linalg.solve(m + 200 * np.eye(200), m[0]), np.linalg.eigvalsh(m + m.T)]
        out += [np.sort(v), v[np.argsort(v)[::7]], np.cumsum(v), np.sin(v) ** 2 + np.cos(v)]
        out += [np.concatenate([v, v[::-1]]), np.where(v > 0.5, v, -v), np.unique(m.round(2))]
        grown = np.array([], dtype=np.float64)
        for i in range(50):
            grown = np.append(grown, v[i * 100 : (i + 1) * 100])
        return [*out, grown, np.fft.rfft(v), m.T.copy(), np.outer(v[:300], v[:300])]

    plain = work()
    with zcoll.use_shared_heap():
        on = work()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(plain, on))


def test_threads_allocate_and_free_concurrently():
    errors = []

    def churn(seed: int) -> None:
        with zcoll.use_shared_heap():  # a thread starts in NumPy's default context
            rng = np.random.default_rng(seed)
            for _ in range(300):
                n = int(rng.integers(100, 300_000))
                a = np.full(n, seed, np.int32)
                if not (zcoll.in_heap(a) and a[-1] == seed):
                    errors.append(seed)

    threads = [threading.Thread(target=churn, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_fork_child_writes_stay_its_own():
    with zcoll.use_shared_heap():
        a = np.zeros(1 << 18)  # a segment of its own
        b = np.zeros(1000)  # a slab block
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: write its copies, then see the parent's later writes never arrive
        a[:] = 1
        b[:] = 1
        os.read(read, 1)
        ok = a[0] == 1 and b[0] == 1 and a[-1] == 1 and zcoll.heap_stats()["forked_child"]
        with zcoll.use_shared_heap():
            ok = ok and not zcoll.in_heap(np.zeros(1 << 18))  # the child allocates privately
        os._exit(0 if ok else 1)
    a[:] = 2
    b[:] = 2
    os.write(write, b"x")
    _, status = os.waitpid(pid, 0)
    os.close(read)
    os.close(write)
    assert os.waitstatus_to_exitcode(status) == 0
    assert a[0] == 2 and b[0] == 2


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=launcher_free_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def zcoll_shm_entries() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("zcoll")}


def test_environment_variable_arrays_outlive_mpi_and_kill_leaves_nothing():
    before = zcoll_shm_entries()
    code = """
        import os, signal
        import numpy as np
        from mpi4py import MPI
        import zcoll
        keep = np.ones(1 << 20)
        assert zcoll.in_heap(keep)
        out = zcoll.alltoall(MPI.COMM_WORLD, keep.reshape(1, -1), np.empty((1, 1 << 20)))
        MPI.Finalize()
        assert zcoll.in_heap(np.zeros(1 << 20)) and out.sum() == 1 << 20
        if os.environ.get("KILL") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        print("done")
    """
    clean = run_python(code, ZCOLL_SHARED_HEAP="1")
    assert clean.returncode == 0 and "done" in clean.stdout, clean.stderr
    killed = run_python(code, ZCOLL_SHARED_HEAP="1", KILL="1")
    assert killed.returncode == -9, killed.stderr
    assert zcoll_shm_entries() <= before


def test_refused_memory_is_a_memory_error():
    code = """
        import resource
        import numpy as np
        import zcoll
        zcoll.use_shared_heap()
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        try:
            np.empty(8 << 30, np.uint8)
        except MemoryError:
            print("MemoryError")
        a = np.ones(1 << 20)  # the heap still works afterwards
        print(zcoll.in_heap(a), a.sum())
    """
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["MemoryError", "True", "1048576.0"]


def test_memory_stays_flat_over_many_cycles():
    rng = np.random.default_rng(1)
    sizes = rng.integers(1 * KIB, 3 * MIB, 2000)

    assert zcoll.heap_stats()["kept_bytes"] <= 64 * MIB

    def cycle() -> None:
        with zcoll.use_shared_heap():
            for n in sizes:
                a = np.empty(int(n), np.uint8)
                a[::4096] = 1
                del a

    cycle()
    first = zcoll.heap_stats()
    for _ in range(4):
        cycle()
    last = zcoll.heap_stats()
    assert last["segment_bytes"] <= first["segment_bytes"] + MIB
    assert last["blocks"] == first["blocks"]
