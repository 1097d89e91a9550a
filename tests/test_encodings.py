"""Sinusoidal position encoding (Vaswani et al. 2017, sec. 3.5; SPEC §2.3).

``PE(p, 2k) = sin(p / base^(2k/d))``, ``PE(p, 2k+1) = cos(p / base^(2k/d))`` ("interleaved"),
or all sines then all cosines ("concatenated"). Checked against the loop reference and for
the two properties SPEC §2.3 names: a fixed rotation takes ``PE(p)`` to ``PE(p + k)``, and
``PE(p + k)·PE(p)`` depends on ``k`` alone while ``PE(p + k)ᵀ W PE(p)`` does not.
"""

from __future__ import annotations

import math

import array_api_compat
import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function
from hypothesis import given, settings
from hypothesis import strategies as st

from relattn import sinusoidal_position_encoding
from relattn.testing import tolerance

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
lazy_xp_function(sinusoidal_position_encoding)

LAYOUTS = ["interleaved", "concatenated"]

#: Positions with a sign and a fraction, exactly representable in float32.
REAL_POSITIONS = np.array(
    [-1000.5, -63.25, -7.5, -3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 2.75, 10.0, 123.125, 4096.0]
)

#: Hypothesis examples per backend and dtype for the property tests.
EXAMPLES = 25


def _pe(backend, positions, d_model, **kwargs):
    return sinusoidal_position_encoding(
        positions, d_model, xp=backend.lib, device=backend.device, **kwargs
    )


def _default_float(backend):
    info = backend.xp.__array_namespace_info__()
    return info.default_dtypes(device=backend.device)["real floating"]


def _check_placement(backend, out):
    assert backend.is_array(out), f"{backend.name} returned a {type(out)}"
    if backend.device is not None:
        assert array_api_compat.device(out) == backend.device


def _sin_cos_columns(d_model: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Column of the sine and of the cosine of each frequency i = 0 … d/2 - 1."""
    half = np.arange(d_model // 2)
    if layout == "interleaved":
        return 2 * half, 2 * half + 1
    return half, d_model // 2 + half


def _frequencies(d_model: int, base: float = 10000.0) -> np.ndarray:
    return np.array([base ** (-2 * i / d_model) for i in range(d_model // 2)])


def _quarter(lo: int, hi: int):
    """Multiples of 1/4 in [lo, hi]: exact in float32, so p + k is exact too."""
    return st.integers(4 * lo, 4 * hi).map(lambda n: n / 4)


# -- against the loop reference ---------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_count_matches_reference(backend, dtype, layout):
    for n in (1, 7, 50):
        for d_model in (2, 8, 64):
            out = _pe(backend, n, d_model, layout=layout, dtype=backend.dtype(dtype))
            _check_placement(backend, out)
            assert out.dtype == backend.dtype(dtype)
            assert tuple(out.shape) == (n, d_model)
            backend.assert_close(
                out, reference.sinusoid(np.arange(n), d_model, layout=layout), dtype
            )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_real_positions_match_reference(backend, dtype, layout):
    """Negative and fractional positions (e.g. relative distances); float dtype is kept."""
    positions = backend.asarray(REAL_POSITIONS, dtype)
    for d_model in (2, 16):
        out = sinusoidal_position_encoding(positions, d_model, layout=layout)
        _check_placement(backend, out)
        assert out.dtype == backend.dtype(dtype)
        assert tuple(out.shape) == (REAL_POSITIONS.shape[0], d_model)
        expected = reference.sinusoid(REAL_POSITIONS, d_model, layout=layout)
        backend.assert_close(out, expected, dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_base(backend, dtype, layout):
    positions = backend.asarray(REAL_POSITIONS[2:-2], dtype)
    out = sinusoidal_position_encoding(positions, 10, base=100.0, layout=layout)
    expected = reference.sinusoid(REAL_POSITIONS[2:-2], 10, base=100.0, layout=layout)
    backend.assert_close(out, expected, dtype)


def test_integer_positions_array(backend):
    """An integer position array gives the namespace's default floating dtype."""
    positions_np = np.arange(-6, 9)
    out = sinusoidal_position_encoding(backend.asarray(positions_np, "int64"), 12)
    _check_placement(backend, out)
    assert out.dtype == _default_float(backend)
    name = "float64" if out.dtype == backend.dtype("float64") else "float32"
    backend.assert_close(out, reference.sinusoid(positions_np, 12), name)


def test_count_default_dtype(backend):
    """An integer count with dtype=None gives the namespace's default floating dtype."""
    out = _pe(backend, 5, 6)
    _check_placement(backend, out)
    assert out.dtype == _default_float(backend)
    name = "float64" if out.dtype == backend.dtype("float64") else "float32"
    backend.assert_close(out, reference.sinusoid(np.arange(5), 6), name)


def test_explicit_dtype_overrides_positions_dtype(backend):
    positions = backend.asarray(REAL_POSITIONS, "float64")
    out = sinusoidal_position_encoding(positions, 8, dtype=backend.dtype("float32"))
    _check_placement(backend, out)
    assert out.dtype == backend.dtype("float32")
    backend.assert_close(out, reference.sinusoid(REAL_POSITIONS, 8), "float32")


def test_empty_count(backend, dtype):
    out = _pe(backend, 0, 4, dtype=backend.dtype(dtype))
    _check_placement(backend, out)
    assert tuple(out.shape) == (0, 4)
    assert out.dtype == backend.dtype(dtype)


def test_numpy_by_default():
    out = sinusoidal_position_encoding(3, 4)
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.float64
    np.testing.assert_allclose(
        out[1], [math.sin(1.0), math.cos(1.0), math.sin(0.01), math.cos(0.01)], rtol=1e-14
    )
    np.testing.assert_array_equal(out[0], [0.0, 1.0, 0.0, 1.0])


def test_layouts_are_a_column_permutation(backend, dtype):
    positions = backend.asarray(REAL_POSITIONS, dtype)
    inter = backend.to_host(sinusoidal_position_encoding(positions, 10, layout="interleaved"))
    concat = backend.to_host(sinusoidal_position_encoding(positions, 10, layout="concatenated"))
    np.testing.assert_array_equal(concat[:, :5], inter[:, 0::2])
    np.testing.assert_array_equal(concat[:, 5:], inter[:, 1::2])


def test_positions_not_mutated(backend, dtype):
    positions = backend.asarray(REAL_POSITIONS, dtype)
    before = np.array(backend.to_host(positions), copy=True)
    backend.to_host(sinusoidal_position_encoding(positions, 8, layout="concatenated"))
    np.testing.assert_array_equal(backend.to_host(positions), before)


# -- SPEC §2.3 property 1: PE(p + k) = M_k PE(p) ----------------------------------------


def _rotation_from(pe_k: np.ndarray, layout: str) -> np.ndarray:
    """The d×d map M_k built only from the values PE(k): per frequency ω,

    sin((p+k)ω) = cos(kω) sin(pω) + sin(kω) cos(pω)
    cos((p+k)ω) = -sin(kω) sin(pω) + cos(kω) cos(pω)
    """
    d_model = pe_k.shape[0]
    s_col, c_col = _sin_cos_columns(d_model, layout)
    m = np.zeros((d_model, d_model))
    for s, c in zip(s_col, c_col, strict=True):
        sin_k, cos_k = pe_k[s], pe_k[c]
        m[s, s], m[s, c] = cos_k, sin_k
        m[c, s], m[c, c] = -sin_k, cos_k
    return m


@pytest.mark.parametrize("layout", LAYOUTS)
def test_offset_is_a_rotation(backend, dtype, layout):
    d_model = 16
    xp = backend.xp

    @settings(max_examples=EXAMPLES, derandomize=True, database=None)
    @given(start=_quarter(-500, 500), k=_quarter(-300, 300))
    def check(start, k):
        p_np = start + 0.75 * np.arange(64)
        pe_k = backend.to_host(
            sinusoidal_position_encoding(
                backend.asarray(np.array([k]), dtype), d_model, layout=layout
            )
        )[0].astype(np.float64)
        m_k = _rotation_from(pe_k, layout)
        # Each 2×2 block is a rotation: M_k M_kᵀ = I.
        np.testing.assert_allclose(m_k @ m_k.T, np.eye(d_model), **tolerance(dtype))

        pe_p = sinusoidal_position_encoding(backend.asarray(p_np, dtype), d_model, layout=layout)
        pe_pk = sinusoidal_position_encoding(
            backend.asarray(p_np + k, dtype), d_model, layout=layout
        )
        rotated = xp.matmul(pe_p, xp.matrix_transpose(backend.asarray(m_k, dtype)))
        backend.assert_close(rotated, backend.to_host(pe_pk), dtype)
        # And against the float64 loop reference of PE(p + k).
        backend.assert_close(rotated, reference.sinusoid(p_np + k, d_model, layout=layout), dtype)

    check()


def test_rotation_is_not_identity():
    """The check above has teeth: M_k differs from the identity, PE(p + k) from PE(p)."""
    pe = sinusoidal_position_encoding(np.array([0.0, 3.0, 5.0]), 8)
    m = _rotation_from(pe[1], "interleaved")
    assert np.abs(m - np.eye(8)).max() > 0.5
    assert np.abs(pe[0] @ m.T - pe[1]).max() < 1e-12
    assert np.abs(pe[2] - pe[0]).max() > 0.5


# -- SPEC §2.3 property 2: PE(p + k)·PE(p) depends on k alone --------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dot_product_depends_on_offset_only(backend, dtype, layout):
    d_model = 16
    xp = backend.xp
    omega = _frequencies(d_model)

    @settings(max_examples=EXAMPLES, derandomize=True, database=None)
    @given(start=_quarter(-500, 500), k=_quarter(-300, 300), seed=st.integers(0, 2**32 - 1))
    def check(start, k, seed):
        p_np = start + 0.75 * np.arange(64)
        pe_p = sinusoidal_position_encoding(backend.asarray(p_np, dtype), d_model, layout=layout)
        pe_pk = sinusoidal_position_encoding(
            backend.asarray(p_np + k, dtype), d_model, layout=layout
        )
        dots = xp.sum(pe_pk * pe_p, axis=-1)
        # Σ_i sin((p+k)ω_i) sin(pω_i) + cos((p+k)ω_i) cos(pω_i) = Σ_i cos(kω_i), for every p.
        backend.assert_close(dots, np.full(p_np.shape, np.cos(k * omega).sum()), dtype)

        # With a random W in between, the score changes with p: no longer relative.
        w = np.random.default_rng(seed).normal(size=(d_model, d_model))
        a, b = backend.to_host(pe_pk).astype(np.float64), backend.to_host(pe_p).astype(np.float64)
        bilinear = np.einsum("pi,ij,pj->p", a, w, b)
        plain = np.einsum("pi,pi->p", a, b)
        assert np.ptp(plain) < 1e-3
        assert np.std(bilinear) > 0.5, np.std(bilinear)

    check()
