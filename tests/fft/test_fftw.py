"""zcoll.fft.fftw: mpi4py-fft's FFTW planners on pyFFTW, against numpy.fft and scipy.fft.

Every expected value is numpy's or scipy's transform of the same data in the same precision
(pocketfft handles float32, float64 and long double), unnormalised as FFTW's; the
normalization factors are checked against their definition and by inverting. The tests do
not communicate, so they pass at any rank count.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.fft

from zcoll.fft import fftw

REAL = [c for c in "fdg" if fftw.get_fftw_lib(c) is not None]
SHAPES_AXES = [((7,), (-1,)), ((8,), (0,)), ((6, 5), (0, 1)), ((6, 5), (1, 0)), ((5, 4, 6), (0, 2))]
FLAGS = (fftw.FFTW_ESTIMATE,)
DCT_INVERSE_TYPE = {1: 1, 2: 3, 3: 2, 4: 4}


def tol(dtype) -> float:
    return {"f": 2e-5, "d": 1e-13, "g": 1e-16}[np.dtype(dtype).char.lower()]


def assert_close(got, ref, dtype=None):
    dtype = got.dtype if dtype is None else dtype
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    scale = max(float(np.abs(ref).max()), 1.0)
    err = float(np.abs(got - ref).max()) / scale
    assert err < tol(dtype), f"relative error {err:.3g} > {tol(dtype):.1g}"


def data(shape, char, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if char in "FDG":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(char)


def norm_axes(shape, axes):
    return tuple(a % len(shape) for a in axes)


@pytest.mark.parametrize("char", REAL)
@pytest.mark.parametrize("shape,axes", SHAPES_AXES)
def test_c2c(char, shape, axes):
    cchar = char.upper()
    A = fftw.aligned(shape, dtype=cchar)
    fwd = fftw.fftn(A, None, axes, 1, FLAGS)
    bck = fftw.ifftn(A.copy(), None, axes, 1, FLAGS)
    x = data(shape, cchar)
    y = fwd(x).copy()
    assert y.dtype == np.dtype(cchar)
    assert_close(y, np.fft.fftn(x, axes=axes))
    n = np.prod([shape[a] for a in axes])
    assert fwd.get_normalization() == pytest.approx(1 / n)
    assert bck.get_normalization() == pytest.approx(1 / n)
    z = bck(y).copy()
    assert_close(z, np.fft.ifftn(y, axes=axes) * n)
    assert_close(bck(y, normalize=True), x)


@pytest.mark.parametrize("char", REAL)
@pytest.mark.parametrize("shape,axes", SHAPES_AXES)
def test_r2c_c2r(char, shape, axes):
    A = fftw.aligned(shape, dtype=char)
    fwd = fftw.rfftn(A, None, axes, 1, FLAGS)
    x = data(shape, char)
    y = fwd(x).copy()
    assert y.dtype == np.dtype(char.upper())
    assert_close(y, np.fft.rfftn(x, axes=axes))
    s = [shape[a] for a in axes]
    n = np.prod(s)
    assert fwd.get_normalization() == pytest.approx(1 / n)
    bck = fftw.irfftn(fwd.output_array.copy(), s, axes, 1, FLAGS)
    assert bck.output_array.shape == shape and bck.output_array.dtype == np.dtype(char)
    assert bck.get_normalization() == pytest.approx(1 / n)
    assert_close(bck(y.copy()), np.fft.irfftn(y, s=s, axes=axes) * n)
    assert_close(bck(y.copy(), normalize=True), x)
    # hfftn is FFTW's c2r and ihfftn its r2c, as in mpi4py-fft
    h = fftw.hfftn(fwd.output_array.copy(), s, axes, 1, FLAGS)
    assert_close(h(y.copy()), np.fft.irfftn(y, s=s, axes=axes) * n)
    assert h.get_normalization() == pytest.approx(1 / n)
    ih = fftw.ihfftn(A.copy(), None, axes, 1, FLAGS)
    assert_close(ih(x), np.fft.rfftn(x, axes=axes))
    assert ih.get_normalization() == pytest.approx(1 / n)


def test_int_flags():
    A = fftw.aligned(6, dtype="D")
    A[:] = data(6, "D")
    keep = A.copy()
    plan = fftw.irfftn(A, s=(10,), flags=fftw.FFTW_ESTIMATE)
    assert_close(plan(), np.fft.irfft(keep, n=10) * 10)


def test_irfftn_without_s_is_even():
    A = fftw.aligned(4, dtype="D")
    A[:] = 1, 2, 3, 4
    out = fftw.irfftn(A, flags=FLAGS)()
    assert out.shape == (6,)
    assert_close(out, np.fft.irfftn([1, 2, 3, 4], s=(6,), axes=(0,)) * 6)


def r2r_norm(kind, n):
    if kind == fftw.FFTW_REDFT00:
        return 2 * (n - 1)
    if kind == fftw.FFTW_RODFT00:
        return 2 * (n + 1)
    return 2 * n


@pytest.mark.parametrize("char", REAL)
@pytest.mark.parametrize("shape,axes", SHAPES_AXES)
@pytest.mark.parametrize("kind", ["dct", "dst"])
@pytest.mark.parametrize("type_", [1, 2, 3, 4])
def test_r2r(char, shape, axes, kind, type_):
    plan, iplan = (fftw.dctn, fftw.idctn) if kind == "dct" else (fftw.dstn, fftw.idstn)
    ref = scipy.fft.dctn if kind == "dct" else scipy.fft.dstn
    table = fftw.dct_type if kind == "dct" else fftw.dst_type
    A = fftw.aligned(shape, dtype=char)
    x = data(shape, char)
    fwd = plan(A, None, axes, type_, 1, FLAGS)
    y = fwd(x).copy()
    assert_close(y, ref(x, type=type_, axes=axes))
    bck = iplan(A.copy(), None, axes, type_, 1, FLAGS)
    assert_close(bck(y), ref(y, type=DCT_INVERSE_TYPE[type_], axes=axes))
    expected = 1.0
    for a in norm_axes(shape, axes):
        expected /= r2r_norm(table[type_], shape[a])
    assert fwd.get_normalization() == pytest.approx(expected)
    assert bck.get_normalization() == pytest.approx(expected)
    assert_close(bck(y, normalize=True), x)


@pytest.mark.parametrize("char", REAL)
def test_mixed_r2r_kinds(char):
    shape, axes = (6, 7), (0, 1)
    kinds = [fftw.FFTW_REDFT10, fftw.FFTW_RODFT01]
    A = fftw.aligned(shape, dtype=char)
    x = data(shape, char)
    plan = fftw.get_planned_FFT(A, A.copy(), axes, kinds, 1, FLAGS)
    y = plan(x).copy()
    ref = scipy.fft.dst(scipy.fft.dct(x, type=2, axis=0), type=3, axis=1)
    assert_close(y, ref)
    inv = fftw.get_planned_FFT(A.copy(), A.copy(), axes, [fftw.inverse[k] for k in kinds], 1, FLAGS)
    M = fftw.get_normalization(kinds, shape, axes)
    assert M == pytest.approx(1 / (2 * 6 * 2 * 7))
    assert_close(inv(y) * M, x)


def test_call_semantics():
    A = fftw.aligned((8, 6), dtype="D")
    plan = fftw.fftn(A, axes=(0, 1), flags=(fftw.FFTW_ESTIMATE, fftw.FFTW_DESTROY_INPUT))
    assert plan.input_array is A
    x = data((8, 6), "D")
    keep = x.copy()
    out = plan(x, implicit=False)
    assert out is plan.output_array
    np.testing.assert_array_equal(x, keep)
    assert_close(out, np.fft.fftn(keep))
    B = fftw.aligned_like(plan.output_array)
    got = plan(x.copy(), B)
    assert got is B
    assert_close(B, np.fft.fftn(keep))
    strided = np.zeros((16, 6), "D")[::2]
    strided[...] = keep
    assert_close(plan(strided), np.fft.fftn(keep))
    assert_close(plan(keep.copy(), normalize=True), np.fft.fftn(keep) / 48)
    with pytest.raises(ValueError):
        plan(keep.copy(), np.zeros((8, 5), "D"))
    preserving = fftw.fftn(A.copy(), flags=(fftw.FFTW_ESTIMATE, fftw.FFTW_PRESERVE_INPUT))
    y = fftw.aligned_like(A)
    y[...] = keep
    preserving(y)
    np.testing.assert_array_equal(y, keep)


def test_update_arrays():
    A = fftw.aligned(8, dtype="d")
    plan = fftw.rfftn(A, flags=FLAGS)
    A2, B2 = fftw.aligned_like(A), fftw.aligned_like(plan.output_array)
    plan.update_arrays(A2, B2)
    assert plan.input_array is A2 and plan.output_array is B2
    A2[:] = np.arange(8)
    assert_close(plan(), np.fft.rfft(np.arange(8.0)))


def test_bad_input():
    with pytest.raises(TypeError):
        fftw.rfftn(fftw.aligned(8, dtype="D"), flags=FLAGS)
    with pytest.raises(TypeError):
        fftw.fftn(fftw.aligned(8, dtype="d"), flags=FLAGS)
    with pytest.raises(TypeError):
        fftw.dctn(fftw.aligned(8, dtype="D"), flags=FLAGS)
    with pytest.raises(ValueError):
        fftw.dctn(fftw.aligned(8, dtype="d"), type=5, flags=FLAGS)
    with pytest.raises(ValueError):
        fftw.irfftn(fftw.aligned(5, dtype="D"), flags=(fftw.FFTW_PRESERVE_INPUT,))
    with pytest.raises(ValueError):
        fftw.rfftn(fftw.aligned(8, dtype="d"), output_array=fftw.aligned(4, dtype="D"))


def test_aligned():
    for n in (8, 16, 32):
        a = fftw.aligned((3, 5), n=n, dtype="F", fill=0)
        assert a.shape == (3, 5) and a.dtype == np.complex64
        assert a.ctypes.data % n == 0 and fftw.get_alignment(a) >= n
        assert not a.any()
        b = fftw.aligned_like(a)
        assert b.shape == a.shape and b.dtype == a.dtype and b.ctypes.data % n == 0
    assert fftw.get_alignment(fftw.aligned(8, n=32, dtype="d")[1:]) == 8


def test_constants():
    assert (fftw.FFTW_FORWARD, fftw.FFTW_BACKWARD, fftw.R2C, fftw.C2R) == (-1, 1, -2, 2)
    assert fftw.FFTW_REDFT00 == 3 and fftw.FFTW_RODFT11 == 10
    assert (fftw.FFTW_MEASURE, fftw.FFTW_ESTIMATE, fftw.FFTW_DESTROY_INPUT) == (0, 64, 1)
    assert fftw.flag_dict["FFTW_ESTIMATE"] == 64
    assert fftw.flag_dict["FFTW_PRESERVE_INPUT"] == 16
    assert all(k.startswith("FFTW_") for k in fftw.flag_dict)
    assert set(fftw.fftlib) >= {"D"}
    assert fftw.inverse[fftw.dctn] is fftw.idctn and fftw.inverse[fftw.rfftn] is fftw.irfftn
    assert fftw.get_fftw_lib("i") is None


def test_wisdom_and_timelimit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fftw.rfftn(fftw.aligned(16, dtype="d"), flags=(fftw.FFTW_MEASURE,))
    fftw.export_wisdom("wisdom.dat")
    assert any(p.name.endswith("_wisdom.dat") for p in tmp_path.iterdir())
    fftw.forget_wisdom()
    fftw.import_wisdom("wisdom.dat")
    fftw.set_timelimit(0.01)
    try:
        plan = fftw.rfftn(fftw.aligned((64, 64), dtype="d"), flags=(fftw.FFTW_PATIENT,))
        x = data((64, 64), "d")
        assert_close(plan(x), np.fft.rfftn(x, axes=(-1,)))
    finally:
        fftw.set_timelimit(-1)
    fftw.cleanup()


def test_partial_planner():
    dct3 = functools.partial(fftw.dctn, type=3)
    A = fftw.aligned((4, 5), dtype="d")
    plan = dct3(A, axes=(1,), flags=FLAGS)
    x = data((4, 5), "d")
    assert_close(plan(x), scipy.fft.dct(x, type=3, axis=1))
