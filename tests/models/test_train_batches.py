"""Training batches: padded sizes by size bucket, host residency, one neighbour list per structure."""

import itertools
import math

import numpy as np
import pytest

pytest.importorskip("ase")
pytest.importorskip("optax")

from e3j_models import bucket_size, nequip
from e3j_models.data import emt_structures
from e3j_models.train import _batches, _padding_shapes, fit, prepare_config

TINY = dict(num_layers=1, num_channels=4, node_irreps="0e + 1o", l_max=1, cutoff=3.0, radial_mlp=(8,))


def _padded(shapes) -> int:
    return sum(n + e for n, e in shapes)


def _least_padding(sizes, max_shapes: int) -> int:
    """Brute force: every split of the batches, ordered by their edges' bucket, into at most
    ``max_shapes`` runs, each padded to its largest nodes and edges on the bucket grid."""
    order = sorted(sizes, key=lambda s: bucket_size(s[1]))
    grid = [bucket_size(e) for _, e in order]
    cuts = [i for i in range(1, len(order)) if grid[i] != grid[i - 1]]  # equal buckets share a run
    best = math.inf
    for k in range(min(max_shapes, len(cuts) + 1)):
        for chosen in itertools.combinations(cuts, k):
            bounds = [0, *chosen, len(order)]
            total = 0
            for a, b in itertools.pairwise(bounds):
                run = order[a:b]
                total += len(run) * (bucket_size(max(n for n, _ in run)) + max(grid[a:b]))
            best = min(best, total)
    return best


def test_bucket_size_is_the_smallest_size_on_its_grid():
    # 300 took 368 where 336 = 8 · ceil(1.1^39) holds 330 already
    assert bucket_size(300) == 336
    for headroom in (0.05, 0.1, 0.25):
        grid = sorted({8 * math.ceil((1 + headroom) ** k) for k in range(400)})
        for n in range(0, 6000, 7):
            b = bucket_size(n, headroom)
            below = [g for g in grid if g < b]
            assert b in grid and b >= n * (1 + headroom), (n, headroom, b)
            assert not below or below[-1] < n * (1 + headroom), (n, headroom, b, below[-1])


@pytest.mark.parametrize("seed", range(12))
def test_padding_shapes_pad_least_within_the_shape_budget(seed):
    rng = np.random.default_rng(seed)
    atoms = rng.choice([8, 31, 32, 108, 256], size=int(rng.integers(1, 14))) * int(rng.integers(1, 5))
    sizes = [(int(n) + 1, int(n) * int(rng.integers(10, 40))) for n in atoms]
    for max_shapes in (1, 2, 3, 5):
        shapes = _padding_shapes(sizes, max_shapes)
        assert len(shapes) == len(sizes) and len(set(shapes)) <= max_shapes
        assert all(pn >= n and pe >= e for (pn, pe), (n, e) in zip(shapes, sizes, strict=True))
        # the least padding that many shapes allow, or one within 10 % of it with fewer shapes
        least = _least_padding(sizes, max_shapes)
        assert least <= _padded(shapes) <= 1.1 * least, (sizes, max_shapes, shapes)
        # and no shape more than pays: one fewer would pad more than 10 % over the least
        fewer = _least_padding(sizes, len(set(shapes)) - 1) if len(set(shapes)) > 1 else None
        assert fewer is None or fewer > 1.1 * least, "a shape was added that saves < 10 %"
    assert len(set(_padding_shapes(sizes, 1))) == 1


def test_padding_shapes_of_equal_and_mixed_batches():
    assert len(set(_padding_shapes([(33, 600)] * 9, 4))) == 1
    # 8-atom and 256-atom cells: the small batches are no longer padded to the large ones
    sizes = [(9, 200)] * 6 + [(257, 6000)] * 2
    one, two = _padding_shapes(sizes, 1), _padding_shapes(sizes, 4)
    assert len(set(one)) == 1 and len(set(two)) == 2
    assert two[0] == (bucket_size(9), bucket_size(200)) and two[-1] == one[-1]
    assert _padded(two) < 0.35 * _padded(one)


def test_mixed_sizes_train_on_smaller_padding_with_the_same_losses():
    """Padding changes no number: the batches of one seed give the same losses padded to one size
    or to a size per bucket."""
    structures = emt_structures(8, repeats=[(1, 1, 2), (1, 1, 2), (1, 1, 2), (3, 3, 3)])
    kw = {"steps": 4, "batch_size": 1, "progress": False, "dtype": np.float64, "eval_every": 4}
    one = fit(nequip((28, 29), **TINY), structures[:6], structures[6:], batch_shapes=1, **kw)
    many = fit(nequip((28, 29), **TINY), structures[:6], structures[6:], **kw)
    assert len(one.history["batch_shapes"]) == 1 and len(many.history["batch_shapes"]) == 2
    (small, large) = many.history["batch_shapes"]
    assert small[0] < large[0] / 4 and tuple(large) == tuple(one.history["batch_shapes"][0])
    np.testing.assert_allclose(many.history["train_loss"], one.history["train_loss"], rtol=1e-10)
    for key, value in one.validation.items():
        np.testing.assert_allclose(many.validation[key], value, rtol=1e-10)
    with pytest.raises(ValueError, match=r"batch_shapes must be an int > 0, got 0"):
        fit(nequip((28, 29), **TINY), structures[:6], structures[6:], batch_shapes=0, **kw)


def test_training_batches_stay_on_the_host():
    # a dataset's batches can exceed a GPU's memory: fit moves each to the device as its step comes
    import jax

    structures = emt_structures(3, repeats=[(2, 2, 2)])
    cfg = prepare_config(nequip((28, 29), **TINY), structures)
    batches = _batches(structures, cfg, 2, None, np.float32)
    leaves = jax.tree.leaves(batches)
    assert leaves and all(type(a) is np.ndarray for a in leaves), {type(a).__name__ for a in leaves}


def test_training_batches_without_a_cpu_backend(monkeypatch):
    # JAX_PLATFORMS=cuda leaves the CPU backend out: local_devices(backend="cpu") raises there
    import jax

    def no_cpu(backend=None, **kwargs):
        raise RuntimeError(f"Unknown backend {backend}")

    structures = emt_structures(2, repeats=[(2, 2, 2)])
    cfg = prepare_config(nequip((28, 29), **TINY), structures)
    want = _batches(structures, cfg, 2, None, np.float32)
    monkeypatch.setattr(jax, "local_devices", no_cpu)
    got = _batches(structures, cfg, 2, None, np.float32)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert type(a) is np.ndarray
        np.testing.assert_array_equal(a, b)


def test_fit_builds_each_neighbour_list_once(monkeypatch):
    from e3j_models import neighbours, train

    calls = []
    original = neighbours.neighbour_list

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(neighbours, "neighbour_list", counted)
    monkeypatch.setattr(train, "neighbour_list", counted)
    structures = emt_structures(5, repeats=[(2, 2, 2)])
    fit(nequip((28, 29), **TINY), structures[:3], structures[3:], steps=1, progress=False)
    assert len(calls) == 5, f"{len(calls)} neighbour lists for 5 structures"


def test_cli_train_refuses_batch_shapes_below_one(tmp_path):
    from e3j_models.__main__ import main

    data = tmp_path / "d.extxyz"
    main(["data", "--num", "3", "--out", str(data)])
    run = ["train", "--data", str(data), "--preset", "nequip", "--out", str(tmp_path / "run")]
    with pytest.raises(SystemExit, match=r"--batch-shapes must be an int > 0, got 0"):
        main([*run, "--batch-shapes", "0"])
    assert not (tmp_path / "run").exists()
