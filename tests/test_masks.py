"""Boolean masks: causal (with memory), local window, DiSAN's three masks, padding.

Every mask is checked against a loop over its definition, ``[query i, key j]``,
``True`` = may attend, and for being a bool array of the backend's library on
the backend's device.
"""

from __future__ import annotations

import array_api_compat
import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function

import relattn

# Lazy on Dask (padding_mask reads its lengths only where Backend.has_values), traced under
# jax.jit on JAX, for every backend test.
lazy_xp_modules = [relattn]
for _function in (
    relattn.causal_mask,
    relattn.local_window_mask,
    relattn.forward_mask,
    relattn.backward_mask,
    relattn.diagonal_disabled_mask,
    relattn.padding_mask,
):
    lazy_xp_function(_function)


def _device_of_backend(backend):
    return array_api_compat.device(backend.asarray(np.zeros(1), "float64"))


def _check_mask(backend, mask, expected):
    """``mask`` is a bool array of the backend, on its device, equal to ``expected``."""
    expected = np.asarray(expected, dtype=bool)
    assert backend.is_array(mask), f"{backend.name} returned a {type(mask)}"
    assert mask.dtype == backend.xp.bool, mask.dtype
    assert tuple(mask.shape) == expected.shape
    assert array_api_compat.device(mask) == _device_of_backend(backend)
    got = backend.to_host(mask)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, expected)


@pytest.fixture(params=["lib", "namespace"])
def xp_arg(request, backend):
    """``xp=`` as the library module (``torch``) or its array-API namespace."""
    return backend.lib if request.param == "lib" else backend.xp


# -- causal -------------------------------------------------------------------------------------


def _causal_loop(lq, lk):
    out = np.zeros((lq, lk), dtype=bool)
    for i in range(lq):
        for j in range(lk):
            # query i sits at key position i + (Lk - Lq): key j visible when j <= i + offset
            out[i, j] = j <= i + (lk - lq)
    return out


SHAPES = [(1, 1), (4, 4), (2, 5), (1, 4), (5, 2), (4, 1), (3, 6)]


@pytest.mark.parametrize(("lq", "lk"), SHAPES)
def test_causal_mask(backend, xp_arg, lq, lk):
    m = relattn.causal_mask(lq, lk, xp=xp_arg, device=backend.device)
    _check_mask(backend, m, _causal_loop(lq, lk))


def test_causal_mask_memory_columns_always_visible(backend):
    # Transformer-XL: M = 3 memory slots before a segment of 2: j <= i + M.
    lq, mem = 2, 3
    m = backend.to_host(relattn.causal_mask(lq, lq + mem, xp=backend.lib, device=backend.device))
    assert m[:, :mem].all()
    np.testing.assert_array_equal(m[:, mem:], np.tril(np.ones((lq, lq), bool)))
    np.testing.assert_array_equal(m.sum(axis=1), [mem + 1, mem + 2])


def test_causal_mask_square_is_lower_triangular(backend):
    m = relattn.causal_mask(5, 5, xp=backend.lib, device=backend.device)
    _check_mask(backend, m, np.tril(np.ones((5, 5), bool)))


def test_causal_mask_default_is_numpy():
    m = relattn.causal_mask(2, 3)
    assert isinstance(m, np.ndarray)
    np.testing.assert_array_equal(m, [[True, True, False], [True, True, True]])


# -- local window -------------------------------------------------------------------------------


def _window_loop(lq, lk, window):
    out = np.zeros((lq, lk), dtype=bool)
    for i in range(lq):
        for j in range(lk):
            out[i, j] = abs(reference.delta(i, j, lq, lk)) <= window
    return out


@pytest.mark.grid
@pytest.mark.parametrize("window", [0, 1, 2, 50])
@pytest.mark.parametrize(("lq", "lk"), [(5, 5), (2, 6), (6, 3), (1, 1)])
def test_local_window_mask(backend, xp_arg, lq, lk, window):
    m = relattn.local_window_mask(lq, lk, window, xp=xp_arg, device=backend.device)
    _check_mask(backend, m, _window_loop(lq, lk, window))


def test_local_window_mask_special_windows(backend):
    lib, dev = backend.lib, backend.device
    # window 0: only the aligned key (the diagonal when square)
    _check_mask(
        backend, relattn.local_window_mask(4, 4, 0, xp=lib, device=dev), np.eye(4, dtype=bool)
    )
    # window 0 with memory: the aligned key is j = i + offset
    _check_mask(
        backend,
        relattn.local_window_mask(2, 4, 0, xp=lib, device=dev),
        [[False, False, True, False], [False, False, False, True]],
    )
    # window 1: the tridiagonal band
    band = np.abs(np.arange(4)[None, :] - np.arange(4)[:, None]) <= 1
    _check_mask(backend, relattn.local_window_mask(4, 4, 1, xp=lib, device=dev), band)
    # window >= L - 1: everything
    _check_mask(
        backend, relattn.local_window_mask(4, 4, 3, xp=lib, device=dev), np.ones((4, 4), bool)
    )
    _check_mask(
        backend, relattn.local_window_mask(3, 5, 100, xp=lib, device=dev), np.ones((3, 5), bool)
    )


# -- DiSAN --------------------------------------------------------------------------------------


def _disan_loop(length, kind):
    out = np.zeros((length, length), dtype=bool)
    for i in range(length):  # query
        for j in range(length):  # key
            out[i, j] = {"forward": j < i, "backward": j > i, "diag": i != j}[kind]
    return out


#: Looked up on relattn at call time, so that lazy_xp_function's patches apply.
DISAN = {"forward": "forward_mask", "backward": "backward_mask", "diag": "diagonal_disabled_mask"}


@pytest.mark.grid
@pytest.mark.parametrize("length", [1, 2, 5, 6])
@pytest.mark.parametrize("kind", sorted(DISAN))
def test_disan_masks(backend, xp_arg, kind, length):
    m = getattr(relattn, DISAN[kind])(length, xp=xp_arg, device=backend.device)
    _check_mask(backend, m, _disan_loop(length, kind))


def test_disan_masks_relations(backend):
    lib, dev = backend.lib, backend.device
    fw = backend.to_host(relattn.forward_mask(5, xp=lib, device=dev))
    bw = backend.to_host(relattn.backward_mask(5, xp=lib, device=dev))
    dd = backend.to_host(relattn.diagonal_disabled_mask(5, xp=lib, device=dev))
    np.testing.assert_array_equal(fw.T, bw)
    np.testing.assert_array_equal(fw | bw, dd)
    assert not (fw & bw).any()
    assert not fw[0].any()  # the first token has no earlier key
    assert not bw[-1].any()  # the last token has no later key
    assert not np.diagonal(dd).any()


def test_disan_sentence(backend):
    tokens = ["I", "come", "from", "China", "!"]
    lib, dev = backend.lib, backend.device
    fw = backend.to_host(relattn.forward_mask(len(tokens), xp=lib, device=dev))
    bw = backend.to_host(relattn.backward_mask(len(tokens), xp=lib, device=dev))
    dd = backend.to_host(relattn.diagonal_disabled_mask(len(tokens), xp=lib, device=dev))
    china = tokens.index("China")

    def seen(row):
        return [t for t, ok in zip(tokens, row, strict=True) if ok]

    assert seen(fw[china]) == ["I", "come", "from"]
    assert seen(bw[china]) == ["!"]
    assert seen(dd[china]) == ["I", "come", "from", "!"]
    assert seen(fw[tokens.index("I")]) == []
    assert seen(bw[tokens.index("I")]) == ["come", "from", "China", "!"]
    assert seen(fw[tokens.index("!")]) == ["I", "come", "from", "China"]
    assert seen(bw[tokens.index("!")]) == []


# -- padding ------------------------------------------------------------------------------------


def _padding_loop(lengths, max_length):
    out = np.zeros((len(lengths), max_length), dtype=bool)
    for b, n in enumerate(lengths):
        for t in range(max_length):
            out[b, t] = t < n
    return out


@pytest.mark.parametrize("int_dtype", ["int64", "int32"])
@pytest.mark.parametrize(
    ("lengths", "max_length"),
    [
        ([0, 2, 5], 5),
        ([5, 5], 5),
        ([0], 3),
        ([3], 3),
        ([1, 4, 2, 0], 4),
        ([7, 1], 4),  # a length beyond max_length marks the whole row real
        ([2, 0], 0),
    ],
)
def test_padding_mask(backend, lengths, max_length, int_dtype):
    lens = backend.asarray(np.asarray(lengths), int_dtype)
    m = relattn.padding_mask(lens, max_length)
    _check_mask(backend, m, _padding_loop(lengths, max_length))


def test_padding_mask_as_key_mask(backend):
    # (B, L) -> (B, 1, 1, L) broadcasts against scores (B, H, Lq, Lk)
    lens = backend.asarray(np.array([1, 3]), "int64")
    m = backend.to_host(relattn.padding_mask(lens, 3))[:, None, None, :]
    scores_like = np.broadcast_to(m, (2, 2, 4, 3))
    assert scores_like[0, 1, 3].tolist() == [True, False, False]
    assert scores_like[1, 0, 0].tolist() == [True, True, True]
