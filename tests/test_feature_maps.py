"""HOG feature map: unit-norm rows, per record, affine-invariant, orientations binned where they belong."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_dp_experiments.feature_maps import hog_features


def edge_image(side: int, vertical: bool) -> np.ndarray:
    """A step edge: left/right halves (vertical edge, horizontal gradient) or top/bottom halves."""
    img = np.zeros((side, side))
    if vertical:
        img[:, side // 2 :] = 1.0
    else:
        img[side // 2 :, :] = 1.0
    return img.ravel()


def test_rows_have_unit_norm_and_the_documented_shape():
    rng = np.random.default_rng(0)
    x = rng.random((7, 64))
    f = hog_features(x, cell=2, bins=6)
    assert f.shape == (7, 4 * 4 * 6)
    np.testing.assert_allclose(np.linalg.norm(f, axis=1), 1.0, atol=1e-12)
    assert (f >= 0).all()
    flat = hog_features(np.full((1, 64), 3.0), cell=2)
    np.testing.assert_array_equal(flat, 0.0)  # no gradient at all: a zero row, norm 0 <= 1


def test_features_are_per_record_and_invariant_to_the_scalar_standardisation():
    """Row i's features do not depend on the other rows (no data-set statistic), across chunk borders."""
    rng = np.random.default_rng(1)
    x = rng.random((20, 144))
    batch = hog_features(x, cell=3, bins=4)
    for i in (0, 7, 19):
        np.testing.assert_allclose(batch[i], hog_features(x[i : i + 1], cell=3, bins=4)[0], atol=1e-15)
    np.testing.assert_allclose(hog_features((x - 0.13) / 0.31, cell=3, bins=4), batch, atol=1e-12)
    import flwr_dp_experiments.feature_maps as fm

    saved, fm.CHUNK_ROWS = fm.CHUNK_ROWS, 6
    try:
        np.testing.assert_allclose(hog_features(x, cell=3, bins=4), batch, atol=1e-15)
    finally:
        fm.CHUNK_ROWS = saved


@pytest.mark.parametrize("vertical, expected_bin", [(True, 0), (False, 2)])
def test_an_edge_puts_its_energy_in_the_bin_of_its_gradient(vertical, expected_bin):
    """Unsigned, 4 bins of 45°: a vertical edge has a horizontal gradient (0°), a horizontal one 90° (bin 2)."""
    f = hog_features(edge_image(8, vertical)[None, :], cell=4, bins=4).reshape(2, 2, 4)
    per_bin = f.sum(axis=(0, 1))
    assert per_bin[expected_bin] == pytest.approx(per_bin.sum())


def test_signed_bins_tell_opposite_gradients_apart():
    up, down = edge_image(8, False), 1.0 - edge_image(8, False)
    unsigned = hog_features(np.stack([up, down]), cell=8, bins=4)
    np.testing.assert_allclose(unsigned[0], unsigned[1], atol=1e-15)
    signed = hog_features(np.stack([up, down]), cell=8, bins=4, signed=True)
    assert np.argmax(signed[0]) != np.argmax(signed[1])


def test_a_gradient_between_two_bin_centres_is_split_linearly():
    """A 22.5° gradient (unsigned, 4 bins of 45°) sits halfway between bins 0 and 1."""
    side = 16
    yy, xx = np.mgrid[0:side, 0:side]
    ramp = (xx * np.cos(np.pi / 8) + yy * np.sin(np.pi / 8)).ravel()
    f = hog_features(ramp[None, :], cell=2, bins=4)[0].reshape(8, 8, 4)
    interior = f[1:-1, 1:-1].sum(axis=(0, 1))  # border pixels have a one-sided (zero) difference
    interior /= interior.sum()
    assert interior[0] == pytest.approx(0.5, abs=1e-9) and interior[1] == pytest.approx(0.5, abs=1e-9)


def test_bad_parameters_raise_with_their_names():
    x = np.zeros((2, 64))
    with pytest.raises(ValueError, match="cell"):
        hog_features(x, cell=3)
    with pytest.raises(ValueError, match="bins"):
        hog_features(x, bins=1)
    with pytest.raises(ValueError, match="square"):
        hog_features(np.zeros((2, 60)))
    with pytest.raises(ValueError, match="2-D"):
        hog_features(np.zeros(64))
