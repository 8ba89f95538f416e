"""zcoll.fft.libfft.FFT: mpi4py-fft's serial FFT on every backend, against numpy.fft/scipy.fft.

Expected values are numpy's (or scipy's) transforms of the same data: the forward output
normalised by 1/N, the backward output not. Padding's expected values apply mpi4py-fft's
truncation and zero-padding rules (written out here) to numpy's transforms of the padded
length. ``execute`` is checked against ``forward``/``backward`` component by component. The
tests do not communicate, so they pass at any rank count.
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest
import scipy.fft
import scipy.fftpack
from mpi4py import MPI

from helpers import fresh_python
from zcoll.fft import _backends, fftw
from zcoll.fft.libfft import FFT, FFTBase

BACKENDS = ["fftw", "pyfftw", "numpy", "scipy", "mkl_fft"]
HAS_MKL = importlib.util.find_spec("mkl_fft") is not None
DTYPES = ["f", "d", "g", "F", "D", "G"]
CASES = [((6, 5, 4), None), ((7, 6), (0,)), ((5, 6, 7), (2, 0)), ((9,), (-1,))]
OPTS = {"planner_effort": "FFTW_ESTIMATE"}


def backend_param(name):
    if name == "mkl_fft":
        return pytest.param(name, marks=pytest.mark.skipif(not HAS_MKL, reason="needs mkl_fft"))
    return name


ALL_BACKENDS = [backend_param(b) for b in BACKENDS]


def supports(backend, dtype) -> bool:
    return not (backend == "mkl_fft" and np.dtype(dtype).char in "gG")


def tol(dtype) -> float:
    return {"f": 3e-5, "d": 1e-13, "g": 1e-16}[np.dtype(dtype).char.lower()]


def assert_close(got, ref, dtype=None):
    dtype = got.dtype if dtype is None else dtype
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    scale = max(float(np.abs(ref).max()), 1.0)
    err = float(np.abs(got - ref).max()) / scale
    assert err < tol(dtype), f"relative error {err:.3g} > {tol(dtype):.1g}"


def data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def full_axes(shape, axes):
    return tuple(range(len(shape))) if axes is None else tuple(a % len(shape) for a in axes)


def real_spectrum(backend, dtype) -> bool:
    return np.dtype(dtype).kind == "f" and backend != "scipy"


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axes", CASES)
def test_forward_backward(backend, dtype, shape, axes):
    if not supports(backend, dtype):
        pytest.skip(f"{backend} has no {dtype}")
    fft = FFT(shape, axes, dtype=dtype, backend=backend, **OPTS)
    ax = full_axes(shape, axes)
    n = int(np.prod([shape[a] for a in ax]))
    cdtype = np.dtype(np.dtype(dtype).char.upper())
    real = real_spectrum(backend, dtype)
    assert fft.real_transform is real
    assert fft.M == pytest.approx(1 / n)
    if backend == "fftw":
        assert fft.fwd.get_normalization() == pytest.approx(1 / n)
    assert fft.forward.input_array.shape == shape
    assert fft.forward.input_array.dtype == np.dtype(dtype)
    assert fft.forward.output_array.dtype == cdtype
    assert fft.backward.input_array is fft.forward.output_array
    assert fft.backward.output_array is fft.forward.input_array
    u = data(shape, dtype)
    ref = np.fft.rfftn(u, axes=ax) if real else np.fft.fftn(u, axes=ax)
    assert fft.forward.output_array.shape == ref.shape
    keep = u.copy()
    uh = fft.forward(u).copy()
    np.testing.assert_array_equal(u, keep)
    assert_close(uh, ref / n, dtype)
    assert_close(fft.forward(u, normalize=False), ref, dtype)
    if real:
        back = np.fft.irfftn(uh, s=[shape[a] for a in ax], axes=ax) * n
    else:
        back = np.fft.ifftn(uh, axes=ax) * n
        if np.dtype(dtype).kind == "f":
            back = back.real
    out = np.empty(shape, dtype)
    assert fft.backward(uh, out) is out
    assert_close(out, back, dtype)
    assert_close(fft.backward(uh), u, dtype)
    assert_close(fft.backward(ref.astype(cdtype), normalize=True), u, dtype)
    assert fft.backward.output_array.dtype == np.dtype(dtype)


def pad_reference(u, axis, pf, backend):
    """mpi4py-fft's padded forward output (normalised) for input `u`, from numpy."""
    Np = u.shape[axis]
    Nt = int(np.round(Np / pf))
    if real_spectrum(backend, u.dtype):
        P = np.moveaxis(np.fft.rfft(u, axis=axis) / Np, axis, -1)
        N = Nt // 2 + 1
        T = P[..., :N].copy()
        if N % 2 == 0:  # mpi4py-fft tests the length of the truncated spectrum
            T[..., N - 1] = 2 * T[..., N - 1].real
    else:
        P = np.moveaxis(np.fft.fft(u, axis=axis) / Np, axis, -1)
        T = np.zeros(P.shape[:-1] + (Nt,), P.dtype)
        T[..., : Nt // 2 + 1] = P[..., : Nt // 2 + 1]
        if Nt // 2:
            T[..., -(Nt // 2) :] += P[..., -(Nt // 2) :]
    return np.moveaxis(T, -1, axis)


def unpad_reference(t, axis, Np, backend, dtype):
    """mpi4py-fft's padded backward output (unnormalised) for spectrum `t`, from numpy."""
    T = np.moveaxis(t, axis, -1)
    if real_spectrum(backend, dtype):
        N = T.shape[-1]
        Q = np.zeros(T.shape[:-1] + (Np // 2 + 1,), T.dtype)
        Q[..., :N] = T
        if N % 2 == 0:
            Q[..., N - 1] = 0.5 * Q[..., N - 1].real
        out = np.fft.irfft(Q, n=Np, axis=-1) * Np
    else:
        Nt = T.shape[-1]
        Q = np.zeros(T.shape[:-1] + (Np,), T.dtype)
        Q[..., : Nt // 2 + 1] = T[..., : Nt // 2 + 1]
        Q[..., -(Nt // 2) :] = T[..., -(Nt // 2) :]
        if Nt % 2 == 0:
            Q[..., Nt // 2] *= 0.5
            Q[..., -(Nt // 2)] *= 0.5
        out = np.fft.ifft(Q, axis=-1) * Np
        if np.dtype(dtype).kind == "f":
            out = out.real
    return np.moveaxis(out, -1, axis)


# (padding factor, truncated length) pairs whose padded length int(nt * pf) rounds back to nt
PADDINGS = [
    (pf, nt) for pf in (1.5, 2.0, 1.25) for nt in (6, 7, 8, 9) if round(int(nt * pf) / pf) == nt
]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("dtype", ["d", "D", "f", "g"])
@pytest.mark.parametrize("pf,nt", PADDINGS)
@pytest.mark.parametrize("axis", [0, 1])
def test_padding(backend, dtype, pf, nt, axis):
    if not supports(backend, dtype):
        pytest.skip(f"{backend} has no {dtype}")
    shape = [3, 3]
    shape[axis] = int(nt * pf)
    fft = FFT(shape, axis, dtype=dtype, backend=backend, padding=pf, **OPTS)
    assert fft.padding_factor == pf
    u = data(shape, dtype)
    ref = pad_reference(u, axis, pf, backend)
    assert fft.forward.output_array.shape == ref.shape
    assert fft.backward.input_array is fft.forward.output_array
    assert fft.backward.output_array.shape == tuple(shape)
    uh = fft.forward(u).copy()
    assert_close(uh, ref, dtype)
    assert_close(fft.backward(uh), unpad_reference(uh, axis, shape[axis], backend, dtype), dtype)
    # a forward transform of the padded field gives its spectrum back (mpi4py-fft's test)
    v = fft.backward(uh).copy()
    assert_close(fft.forward(v), uh, dtype)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("dtype", ["d", "D"])
@pytest.mark.parametrize("shape,axis,pf", [((9,), 0, 1.5), ((3, 12), 1, 1.5),
                                           ((8, 3), 0, 2.0), ((3, 8), 1, 1.0)])  # fmt: skip
def test_bind(backend, dtype, shape, axis, pf):
    """bind's calls (what forward()/backward() of a parallel FFT run) against numpy's padded
    references, twice on new data in the same arrays: views made once must not go stale."""
    fft = FFT(shape, axis, dtype=dtype, backend=backend, padding=pf, **OPTS)
    src = fftw.aligned(shape, dtype=dtype)
    spec = fft.forward.output_array
    dst = fftw.aligned(spec.shape, dtype=spec.dtype)
    back = fftw.aligned(shape, dtype=dtype)
    forward = fft.bind(src, dst, False, True, False, None)
    backward = fft.bind(dst, back, True, False, True, None)
    for seed in (1, 2):
        src[...] = data(shape, dtype, seed)
        n = shape[axis]
        if pf == 1.0:
            real = real_spectrum(backend, dtype)
            ref = (np.fft.rfft if real else np.fft.fft)(src, axis=axis) / n
        else:
            ref = pad_reference(src, axis, pf, backend)
        forward()
        assert_close(dst, ref, dtype)
        if pf == 1.0:
            expected = np.fft.irfft(dst, n, axis) if real else np.fft.ifft(dst, axis=axis)
            expected = (expected * n).astype(dtype, copy=False) if real else expected * n
        else:
            expected = unpad_reference(dst, axis, n, backend, dtype)
        backward()
        assert_close(back, expected, dtype)


def test_padding_list():
    fft = FFT((4, 12), (1,), dtype="d", padding=[1, 1.5], **OPTS)
    assert fft.padding_factor == 1.5
    assert fft.forward.output_array.shape == (4, 5)
    with pytest.raises(ValueError, match="one transformed axis"):
        FFT((4, 12), (0, 1), padding=1.5, **OPTS)


@pytest.mark.parametrize("axes", [(1,), (0, 1)])
@pytest.mark.parametrize("dtype", ["d", "f", "g"])
def test_transforms_fftw_dct(axes, dtype):
    dct = functools.partial(fftw.dctn, type=3)
    idct = functools.partial(fftw.idctn, type=3)
    shape = (6, 5)
    fft = FFT(shape, axes, dtype, backend="fftw", transforms={axes: (dct, idct)}, **OPTS)
    M = 1.0
    for a in axes:
        M /= 2 * shape[a]
    assert fft.M == pytest.approx(M)
    u = data(shape, dtype)
    uh = fft.forward(u).copy()
    assert_close(uh, scipy.fft.dctn(u, type=3, axes=axes) * M, dtype)
    assert_close(fft.backward(uh), scipy.fft.dctn(uh, type=2, axes=axes), dtype)
    assert_close(fft.backward(uh / M, normalize=True), u, dtype)


def test_transforms_fftw_mixed_axes():
    dst = functools.partial(fftw.dstn, type=1)
    idst = functools.partial(fftw.idstn, type=1)
    fft = FFT((4, 6, 5), (2,), "d", transforms={(2,): (dst, idst)}, **OPTS)
    assert fft.M == pytest.approx(1 / (2 * 6))
    u = data((4, 6, 5), "d")
    assert_close(fft.forward(u), scipy.fft.dst(u, type=1, axis=2) / 12)
    # a key for other axes is not used
    fft = FFT((4, 6), (1,), "d", transforms={(0,): (dst, idst)}, **OPTS)
    assert_close(fft.forward(data((4, 6), "d")), np.fft.rfft(data((4, 6), "d")) / 6)


def other_backend_transforms(backend):
    if backend == "pyfftw":
        import pyfftw.builders

        return pyfftw.builders.rfftn, pyfftw.builders.irfftn
    if backend == "numpy":
        return np.fft.rfftn, np.fft.irfftn
    if backend == "mkl_fft":
        mkl = importlib.import_module("mkl_fft._numpy_fft")
        return mkl.rfftn, mkl.irfftn
    return scipy.fftpack.fftn, scipy.fftpack.ifftn


@pytest.mark.parametrize("backend", [backend_param(b) for b in BACKENDS[1:]])
@pytest.mark.parametrize("axes", [(1,), (0, 1)])
def test_transforms_other_backends(backend, axes):
    pair = other_backend_transforms(backend)
    shape = (6, 7)
    fft = FFT(shape, axes, backend=backend, transforms={axes: pair})
    u = data(shape, "d")
    n = int(np.prod([shape[a] for a in axes]))
    full = backend == "scipy"
    ref = (np.fft.fftn if full else np.fft.rfftn)(u, axes=axes)
    assert_close(fft.forward(u), ref / n)
    out = fft.backward(fft.forward(u).copy())
    assert_close(out, u)


class RecordingAllocator:
    def __init__(self):
        self.arrays = []

    def __call__(self, shape, dtype):
        a = fftw.aligned(shape, n=64, dtype=dtype)
        self.arrays.append(a)
        return a


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("padding", [False, 1.5])
def test_allocator(backend, padding):
    alloc = RecordingAllocator()
    fft = FFT((4, 12), (1,), "d", padding=padding, backend=backend, allocator=alloc, **OPTS)
    owned = [fft.forward.input_array, fft.forward.output_array, fft.backward.input_array]
    for a in owned:
        assert any(a is b for b in alloc.arrays)
    uh = fft.forward(data((4, 12), "d")).copy()
    assert_close(fft.forward(fft.backward(uh).copy()), uh)


@pytest.mark.parametrize("backend", ["fftw", "pyfftw", "numpy"])
def test_allocator_with_transforms(backend):
    alloc = RecordingAllocator()
    pair = {
        "fftw": (functools.partial(fftw.dctn, type=2), functools.partial(fftw.idctn, type=2)),
        "pyfftw": other_backend_transforms("pyfftw"),
        "numpy": (np.fft.rfftn, np.fft.irfftn),
    }[backend]
    fft = FFT((4, 6), (1,), "d", backend=backend, transforms={(1,): pair}, allocator=alloc)
    assert any(fft.forward.output_array is b for b in alloc.arrays)
    assert any(fft.forward.input_array is b for b in alloc.arrays)
    u = data((4, 6), "d")
    assert_close(fft.backward(fft.forward(u).copy()), u)


def custom_pair(backend):
    if backend == "fftw":
        return functools.partial(fftw.dctn, type=2), functools.partial(fftw.idctn, type=2)
    return other_backend_transforms(backend)


def make_exec_fft(backend, dtype, kind):
    if kind == "transforms":
        pair = custom_pair(backend)
        return FFT((6, 5, 4), (2, 1), dtype, backend=backend, transforms={(2, 1): pair}, **OPTS)
    if kind == "padded":
        return FFT((6, 5, 12), (2,), dtype, padding=1.5, backend=backend, **OPTS)
    return FFT((6, 5, 4), (0, 2), dtype, backend=backend, **OPTS)


NO_MKL = pytest.mark.skipif(not HAS_MKL, reason="needs mkl_fft")
EXEC_CASES = [
    pytest.param(b, dtype, kind, marks=[NO_MKL] if b == "mkl_fft" else [])
    for b in BACKENDS
    for dtype in ("d", "D", "f", "g")
    for kind in ("plain", "padded")
    if supports(b, dtype)
] + [
    ("fftw", "d", "transforms"),
    ("fftw", "g", "transforms"),
    ("pyfftw", "f", "transforms"),
    ("numpy", "d", "transforms"),
]


@pytest.mark.parametrize("backend,dtype,kind", EXEC_CASES)
@pytest.mark.parametrize("lead", [(), (3,), (2, 2)])
@pytest.mark.parametrize("normalize", [False, True])
def test_execute(backend, dtype, kind, lead, normalize):
    fft = make_exec_fft(backend, dtype, kind)
    fin, fout = fft.forward.input_array, fft.forward.output_array
    src = data(lead + fin.shape, dtype)
    keep = src.copy()
    dst = np.empty(lead + fout.shape, fout.dtype)
    assert fft.execute(src, dst, inverse=False, normalize=normalize) is dst
    np.testing.assert_array_equal(src, keep)
    for i in np.ndindex(*lead):
        assert_close(dst[i], fft.forward(src[i], normalize=normalize), dtype)
    spec = dst.copy()
    back = np.empty(lead + fin.shape, fin.dtype)
    assert fft.execute(spec, back, inverse=True, normalize=normalize) is back
    np.testing.assert_array_equal(spec, dst)
    for i in np.ndindex(*lead):
        assert_close(back[i], fft.backward(spec[i], normalize=normalize), dtype)
    again = np.empty_like(back)
    fft.execute(spec.copy(), again, inverse=True, normalize=normalize, destroy_input=True)
    assert_close(again, back, dtype)


def test_execute_bad_arrays():
    fft = FFT((6, 8), dtype="d", **OPTS)
    src = np.zeros((6, 8))
    with pytest.raises(ValueError):
        fft.execute(src, np.zeros((6, 8), "D"), inverse=False, normalize=True)
    with pytest.raises(ValueError):
        fft.execute(np.zeros((2, 6, 8)), np.zeros((3, 6, 5), "D"), inverse=False, normalize=True)
    with pytest.raises(TypeError):
        fft.execute(src.astype("f"), np.zeros((6, 5), "D"), inverse=False, normalize=True)
    with pytest.raises(TypeError):
        fft.execute(np.zeros((6, 5), "D"), np.zeros((6, 8), "f"), inverse=True, normalize=True)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_bad_keyword(backend):
    with pytest.raises(TypeError, match="bogus"):
        FFT((8,), backend=backend, bogus=1)
    fft = FFT((8,), backend=backend, threads=1, **OPTS)
    with pytest.raises(TypeError, match="bogus"):
        fft.forward(bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        fft.backward(bogus=1)


def test_call_options():
    fft = FFT((8,), backend="fftw", **OPTS)
    u = data((8,), "d")
    assert_close(fft.forward(u, implicit=False), np.fft.rfft(u) / 8)
    fft = FFT((8,), backend="pyfftw", **OPTS)
    assert_close(fft.forward(u, criteria_checking=True), np.fft.rfft(u) / 8)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_bad_dtype(backend):
    with pytest.raises(TypeError, match="dtype"):
        FFT((8,), dtype=np.int64, backend=backend)


def test_long_double_unsupported(monkeypatch):
    """Builds without long double: pyFFTW's for 'pyfftw' (and for 'fftw' without mpi4py-fft),
    mpi4py-fft's compiled FFTW module for 'fftw' where it is installed."""
    import pyfftw

    monkeypatch.setattr(pyfftw, "_supported_types", ["32", "64"])
    lib = _backends.mpi4py_fftw()
    if lib is not None:
        monkeypatch.setattr(lib, "fftlib", {k: v for k, v in lib.fftlib.items() if k != "G"})
    for backend in ("fftw", "pyfftw"):
        with pytest.raises(TypeError, match="longdouble|float128|float96"):
            FFT((8,), dtype="g", backend=backend)


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="one process: the P = 1 run only")
def test_fftw_backend_on_mpi4py_fft_leaves_pyfftw_unimported():
    """Where 'fftw' runs on mpi4py-fft's compiled module, making and running a transform
    imports no pyFFTW, whose import costs a process about 0.5 s (it imports scipy.fftpack)."""
    if _backends.mpi4py_fftw() is None:
        pytest.skip("mpi4py-fft is not installed")
    code = """
        import sys
        import numpy as np
        from zcoll.fft.libfft import FFT
        fft = FFT((8, 6), dtype="d", backend="fftw")
        u = np.random.default_rng(1).random((8, 6))
        assert np.allclose(fft.backward(fft.forward(u).copy()), u)
        print("pyfftw" in sys.modules)
    """
    run = fresh_python(code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-1] == "False", run.stdout


def test_mkl_fft_missing_or_long_double():
    if HAS_MKL:
        with pytest.raises(TypeError, match="mkl_fft"):
            FFT((8,), dtype="g", backend="mkl_fft")
    else:
        with pytest.raises(ImportError, match="mkl_fft"):
            FFT((8,), backend="mkl_fft")


def test_bad_arguments():
    with pytest.raises(ValueError, match="backend"):
        FFT((8,), backend="nope")
    with pytest.raises(ValueError):
        FFT((8, 4), axes=(2,))
    with pytest.raises(ValueError):
        FFT((8, 4), axes=(0, 0))
    with pytest.raises(ValueError):
        FFT((0, 4))


def test_fftbase():
    base = FFTBase((4, 5, 6), axes=(-1, 0), dtype="F")
    assert base.axes == [2, 0] and base.shape == [4, 5, 6]
    assert base.real_transform is False and base.padding_factor == 1
    assert FFTBase(8).axes == [0]


def test_steps_are_unnormalised():
    fft = FFT((8, 6), dtype="D", backend="numpy")
    u = data((8, 6), "D")
    fft.fwd.input_array[...] = u
    assert_close(fft.fwd(), np.fft.fftn(u))


@pytest.mark.parametrize("library", ["mpi4py-fft", "pyfftw"])
@pytest.mark.parametrize("dtype", ["d", "D", "g"])
def test_fftw_backend_library(library, dtype, monkeypatch):
    """'fftw' runs on mpi4py-fft's compiled FFTW where it is installed, on pyFFTW's where not
    (as if absent: the module lookup says None); same values either way, also through
    execute() with leading component axes."""
    real = _backends.mpi4py_fftw()
    if library == "mpi4py-fft" and real is None:
        pytest.skip("mpi4py-fft is not installed")
    monkeypatch.setattr(_backends, "_MPI4PY_FFTW", [real if library == "mpi4py-fft" else None])
    shape, axes = (6, 5, 8), (0, 2)
    fft = FFT(shape, axes, dtype, backend="fftw", **OPTS)
    expected = _backends.FftwLibBackend if library == "mpi4py-fft" else _backends.PyfftwBackend
    assert type(fft._engine) is expected
    a = data(shape, dtype)
    np_axes = full_axes(shape, axes)
    long = np.dtype(dtype).char in "gG"
    high = np.clongdouble if long else np.complex128
    if np.dtype(dtype).kind == "f":
        ref = np.fft.rfftn(a.astype(np.longdouble if long else np.float64), axes=np_axes) / 48
    else:
        ref = np.fft.fftn(a.astype(high), axes=np_axes) / 48
    assert_close(fft.forward(a), ref, dtype)
    u = np.stack([a, 2 * a])
    u_hat = np.empty((2, *fft.forward.output_array.shape), fft.forward.output_array.dtype)
    fft.execute(u, u_hat, inverse=False, normalize=True)
    assert_close(u_hat[1], 2 * ref, dtype)
    back = np.empty_like(u)
    fft.execute(u_hat, back, inverse=True, normalize=False, destroy_input=True)
    assert_close(back, u, dtype)
