"""The shared heap's process semantics (zcoll.use_shared_heap), one process at a time: the
same as NumPy's own allocator. Which arrays it takes, memory given back and kept within bounds,
resize, views, pickling and np.save/np.load, a NumPy workload with the same results, threads,
fork (each side's writes its own), arrays outliving MPI and the interpreter, kill -9 leaving
nothing, and a refused request as MemoryError. Nothing here communicates: run_mpi.py runs it at
P = 1 and 2 only.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import threading

import numpy as np

import zcoll
from helpers import launcher_free_env, rss_bytes

KIB, MIB = 1 << 10, 1 << 20


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


def _child_sees_its_snapshot(a, b, started, resume, result) -> None:
    """multiprocessing child (fork): its heap arrays hold what the parent had at the fork,
    its writes are its own, and the parent's later writes never reach it."""
    ok = bool((a == 3).all() and (b == 3).all())
    a[:] = 4
    b[:] = 4
    started.set()
    resume.wait(60)
    result.put(ok and bool((a == 4).all() and (b == 4).all()))


def test_multiprocessing_fork_children_keep_their_own_arrays():
    with zcoll.use_shared_heap():
        a = np.full(1 << 18, 3.0)  # a segment of its own
        b = np.full(1000, 3.0)  # a slab block
    fork = multiprocessing.get_context("fork")
    started, resume, result = fork.Event(), fork.Event(), fork.Queue()
    child = fork.Process(target=_child_sees_its_snapshot, args=(a, b, started, resume, result))
    child.start()
    try:
        assert started.wait(60)
        assert (a == 3).all() and (b == 3).all()  # the child's writes did not come here
        a[:] = 5
        b[:] = 5
        resume.set()
        assert result.get(timeout=60) is True
    finally:
        child.join(60)
    assert child.exitcode == 0
    assert (a == 5).all() and (b == 5).all() and zcoll.in_heap(a)


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


def test_heap_sized_requests_past_the_limit_are_a_memory_error():
    """Requests the heap takes (16 MiB each, below its huge size) until the address space is
    spent: the heap's segments fail first, then NumPy's own allocator, and the request raises
    MemoryError -- no crash, every array made before intact and in the heap -- and once they are
    freed the heap serves again."""
    code = """
        import resource
        import numpy as np
        import zcoll
        zcoll.use_shared_heap()
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
        limit = mapped + (512 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        held = []
        try:
            for k in range(1000):
                a = np.empty(16 << 20, np.uint8)
                a[::4096] = k % 251
                held.append(a)
        except MemoryError:
            print("MemoryError")
        print(len(held) > 4, all(zcoll.in_heap(a) for a in held[:4]))
        print(all((a[::4096] == k % 251).all() for k, a in enumerate(held)))
        held.clear()
        b = np.ones(16 << 20, np.uint8)
        print(zcoll.in_heap(b), int(b.sum()))
    """
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["MemoryError", "True", "True", "True", "True", str(16 << 20)]


def test_memory_stays_flat_over_many_cycles():
    """10^5 allocate/free cycles of mixed sizes (1 KiB-3 MiB, every page touched): the heap's
    segments and blocks, this process's resident memory and its resident shared memory stay
    within 1 MiB of where the first 2000 left them."""
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
    first, rss, shmem = zcoll.heap_stats(), rss_bytes(), rss_shmem()
    for _ in range(49):
        cycle()
    last = zcoll.heap_stats()
    assert last["segment_bytes"] <= first["segment_bytes"] + MIB
    assert last["blocks"] == first["blocks"]
    assert rss_bytes() <= rss + MIB, (rss_bytes() - rss) / MIB
    assert rss_shmem() <= shmem + MIB, (rss_shmem() - shmem) / MIB
