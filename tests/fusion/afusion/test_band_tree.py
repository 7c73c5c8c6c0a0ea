"""The AFUSION kernel as TileFlow's tile tree (fusion/afusion/band_tree.py): the halo rows computed once a band and
again by the next, the input's reuse across bands as a step-by-step enumeration counts it, the buffer's level from
the L2's size, and the prediction's trade of halo, weights and threads."""

from __future__ import annotations

import pytest

from onnxopt.annotate import tile_tree as tt
from onnxopt.fusion.afusion.band_tree import ConvPair, band_tree, model_band_rows, predicted_seconds
from onnxopt.hardware.machine_model import Machine, MemoryLevel

BIG = 1 << 30  # an L2 that holds any band


def _machine(l3_gbs: float = 100.0, l2_bytes: int = 1 << 20) -> Machine:
    g = 1e9
    return Machine("test", 2, ["avx2"], {"float32": 200 * g}, [
        MemoryLevel("L1", 64 << 10, 400 * g), MemoryLevel("L2", 2 * l2_bytes, 200 * g),
        MemoryLevel("L3", 32 << 20, l3_gbs * g), MemoryLevel("DRAM", None, 40 * g)])


def test_a_band_computes_its_halo_rows():
    g = ConvPair(ic=4, oc1=8, oc2=6, k1=3, k2=3, st1=1, st2=1, out_h=12, out_w=10)
    band, ext = band_tree(g, 4, BIG)
    assert tt.illegal(band) is None and band.level == "L2"
    an = tt.analyze(band, ext, outer="L3")
    conv1, conv2 = an.tiles[1:]
    # 4 output rows of a 3x3 need 6 intermediate rows of 12 columns; each a 4-channel 3x3 window
    assert tt._points(conv1.tile, ext) == 8 * 6 * 12 * 4 * 9
    assert tt._points(conv2.tile, ext) == 6 * 4 * 10 * 8 * 9
    assert tt._inside(band, band, "I")  # the intermediate never leaves the band
    assert an.tiles[0].loads == 4 * 8 * 14 + 8 * 4 * 9 + 6 * 8 * 9  # input rows with both halos, both weights
    assert an.tiles[0].stores == 6 * 4 * 10


@pytest.mark.parametrize("st1,st2,k1,k2", [(1, 1, 3, 3), (2, 1, 3, 1), (1, 2, 1, 3), (2, 2, 3, 3)])
def test_the_inputs_reuse_across_bands_equals_the_enumeration(st1, st2, k1, k2):
    """Three bands of two rows under a parent: the input rows two neighbouring bands share are not moved again."""
    g = ConvPair(ic=2, oc1=3, oc2=2, k1=k1, k2=k2, st1=st1, st2=st2, out_h=6, out_w=3)
    band, ext = band_tree(g, 2, BIG)
    ext = dict(ext, y=6)
    parent = tt.Tile("L3", loops=(tt.Loop("y", 3),), children=(band,))
    for tensor in ("X", "W1", "W2", "Y"):
        assert tt._movement(parent, ext, tensor) == tt.enumerate_movement(parent, ext, tensor), tensor


def test_the_buffer_leaves_the_l2_when_the_band_outgrows_it():
    g = ConvPair(ic=64, oc1=64, oc2=64, k1=1, k2=3, st1=1, st2=1, out_h=56, out_w=56)
    small, _ = band_tree(g, 2, 256 * 1024)
    tall, _ = band_tree(g, 28, 256 * 1024)
    assert small.level == "L2" and tall.level == "L3"


def test_the_halo_favours_taller_bands_and_the_threads_balanced_ones():
    """A 1x1 -> 3x3 pair recomputes two intermediate rows a band: one-row bands compute three times the first
    convolution's rows, so the model prefers taller ones; with one thread the time is the bands' sum, with two the
    busier thread's."""
    g = ConvPair(ic=64, oc1=64, oc2=64, k1=1, k2=3, st1=1, st2=1, out_h=56, out_w=56)
    m = _machine()
    assert predicted_seconds(g, 1, m, 2) > predicted_seconds(g, 7, m, 2) > predicted_seconds(g, 14, m, 2)
    one = predicted_seconds(g, 14, m, 1)
    assert predicted_seconds(g, 14, m, 2) == pytest.approx(one / 2, rel=0.05)
    assert model_band_rows(g, m, 2) == 14  # the tallest that still gives each thread two bands


def test_a_slow_l3_makes_the_weights_read_a_band_count():
    """A 1x1 -> 1x1 pair has no halo: on a fast L3 the heights tie (the prediction is the compute); where the L3
    barely feeds the arithmetic, reading both weights again for every one-row band makes short bands slower."""
    g = ConvPair(ic=256, oc1=256, oc2=256, k1=1, k2=1, st1=1, st2=1, out_h=56, out_w=8)
    fast, slow = _machine(l3_gbs=1000.0), _machine(l3_gbs=2.0)
    assert predicted_seconds(g, 1, fast, 2) == pytest.approx(predicted_seconds(g, 14, fast, 2), rel=1e-6)
    assert predicted_seconds(g, 1, slow, 2) > 1.5 * predicted_seconds(g, 14, slow, 2)


def test_chimeras_band_is_the_tallest_that_fits_a_cores_l2():
    """Chimera's model gives the AFUSION kernel the tallest band whose input rows, weights, intermediate and output
    rows fit a core's L2 (balanced over the threads): a smaller L2 gives shorter bands, with no edit elsewhere."""
    from onnxopt.annotate.data_movement import conv_chain_movement
    from onnxopt.fusion.afusion.band_tree import chimera_band_rows

    g = ConvPair(ic=64, oc1=128, oc2=64, k1=3, k2=1, st1=1, st2=1, out_h=56, out_w=56)  # Chimera's C3
    rows = {l2: chimera_band_rows(g, _machine(l2_bytes=l2), 2) for l2 in (384 << 10, 512 << 10, 1 << 20)}
    assert rows[384 << 10] < rows[512 << 10] < rows[1 << 20] == 14  # two bands a thread at most
    band = dict(h=rows[1 << 20], w=56, c=128, i=64, o=64)
    assert conv_chain_movement(g, band).mu <= (1 << 20) // 4
