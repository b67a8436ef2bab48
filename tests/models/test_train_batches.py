"""Training batches: drawn anew every epoch, padded sizes by size bucket (and graphs), host residency,
one neighbour list per structure."""

import dataclasses
import io
import itertools
import math

import numpy as np
import pytest

pytest.importorskip("ase")
pytest.importorskip("optax")

from e3j_models import bucket_size, nequip
from e3j_models._batching import _batch, _batches, _padding_shapes
from e3j_models.data import emt_structures
from e3j_models.neighbours import _checked_graph, batch_structures
from e3j_models.train import epoch_losses, fit, loss_fn, prepare_config

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


def _count_neighbour_lists(monkeypatch) -> list:
    from e3j_models import _training_data, neighbours

    calls = []
    original = neighbours.neighbour_list

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    # every module that calls it by its own name
    monkeypatch.setattr(neighbours, "neighbour_list", counted)
    monkeypatch.setattr(_training_data, "neighbour_list", counted)
    return calls


def test_fit_builds_each_neighbour_list_once(monkeypatch):
    calls = _count_neighbour_lists(monkeypatch)
    structures = emt_structures(5, repeats=[(2, 2, 2)])
    fit(nequip((28, 29), **TINY), structures[:3], structures[3:], steps=1, progress=False)
    assert len(calls) == 5, f"{len(calls)} neighbour lists for 5 structures"


def test_cli_train_builds_each_neighbour_list_once(monkeypatch, tmp_path):
    """The command line checks its data before --out is touched, and fit trains on the graphs that
    check built (they were built twice)."""
    from e3j_models.__main__ import main
    from e3j_models.data import write_dataset

    data = tmp_path / "d.extxyz"
    write_dataset(data, emt_structures(5, repeats=[(2, 2, 2)]))
    calls = _count_neighbour_lists(monkeypatch)
    args = ["train", "--data", str(data), "--preset", "nequip", "--out", str(tmp_path / "run"), "--channels", "2"]
    main([*args, "--layers", "1", "--l-max", "1", "--cutoff", "3.0", "--radial-hidden", "4", "--steps", "1"])
    assert (tmp_path / "run" / "metrics.json").exists()
    assert len(calls) == 5, f"{len(calls)} neighbour lists for 5 structures"


def test_cli_train_refuses_bad_arguments_before_touching_out(tmp_path):
    from e3j_models.__main__ import main

    data = tmp_path / "d.extxyz"
    main(["data", "--num", "3", "--out", str(data)])
    run = ["train", "--data", str(data), "--preset", "nequip", "--out", str(tmp_path / "run")]
    with pytest.raises(SystemExit, match=r"--batch-shapes must be an int > 0, got 0"):
        main([*run, "--batch-shapes", "0"])
    with pytest.raises(SystemExit, match=r"--state-every must be an int > 0, got 0"):
        main([*run, "--state-every", "0"])
    for bad in ("1.0", "nan", "-0.5"):
        with pytest.raises(SystemExit, match=r"--ema-decay must be in \(0, 1\), got"):
            main([*run, "--ema-decay", bad])
    assert not (tmp_path / "run").exists()


def _recorded_batches(monkeypatch, train_structures):
    """fit's batches of ``train_structures`` as it builds them: ``[(structure indices, padded shapes)]``
    (a few more than it trains on: they are built ahead)."""
    import jax

    from e3j_models import train

    built = []
    original = train._batch

    def recording(structures, group, *args, **kwargs):
        out = original(structures, group, *args, **kwargs)
        if structures is train_structures:
            built.append((sorted(int(k) for k in group), tuple(np.shape(a) for a in jax.tree.leaves(out))))
        return out

    monkeypatch.setattr(train, "_batch", recording)
    return built


def test_every_epoch_draws_new_batches(monkeypatch):
    """mace-torch's shuffled loader: each epoch visits every structure once, in batches of a new
    seeded membership; the same seed draws the same batches."""
    structures = emt_structures(10, repeats=[(1, 1, 2)])
    train = structures[:8]
    built = _recorded_batches(monkeypatch, train)
    kw = {"steps": 12, "batch_size": 2, "progress": False, "seed": 3}
    fit(nequip((28, 29), **TINY), train, structures[8:], **kw)
    first = [g for g, _ in built[:12]]
    assert len(first) == 12
    epochs = [first[:4], first[4:8], first[8:]]
    for epoch in epochs:
        assert sorted(k for g in epoch for k in g) == list(range(8)), epoch
    memberships = [{tuple(g) for g in epoch} for epoch in epochs]
    assert memberships[0] != memberships[1] and memberships[1] != memberships[2], memberships
    built.clear()
    fit(nequip((28, 29), **TINY), train, structures[8:], **kw)
    assert [g for g, _ in built[:12]] == first
    built.clear()
    fit(nequip((28, 29), **TINY), train, structures[8:], **{**kw, "seed": 4})
    assert [g for g, _ in built[:12]] != first


def test_a_smaller_last_batch_keeps_the_shapes_and_padding_is_counted(monkeypatch):
    """5 structures in batches of 2: the last batch of each epoch holds one structure and an empty
    graph, in the shapes of the others (no compile of its own); history's padding is the padded
    over the real nodes and edges of the batches trained on."""
    structures = emt_structures(7, repeats=[(1, 1, 2), (2, 1, 2), (2, 2, 2)])
    train = structures[:5]
    built = _recorded_batches(monkeypatch, train)
    cfg = prepare_config(nequip((28, 29), **TINY), train)
    result = fit(cfg, train, structures[5:], steps=6, batch_size=2, batch_shapes=1, progress=False)
    del built[6:]  # built ahead, not trained on
    assert [len(g) for g, _ in built] == [2, 2, 1, 2, 2, 1]
    assert len({shapes for _, shapes in built}) == 1, {shapes for _, shapes in built}
    ((nodes, edges),) = result.history["batch_shapes"]
    real_nodes = sum(len(structures[k]) for g, _ in built for k in g)
    real_edges = 0
    for g, _ in built:
        (b, _) = _batches([structures[k] for k in g], cfg, 2, None, np.float32)[0]
        real_edges += int(b.graph.num_valid)
    assert result.history["padding"]["nodes"] == pytest.approx(6 * nodes / real_nodes)
    assert result.history["padding"]["edges"] == pytest.approx(6 * edges / real_edges)


@pytest.mark.parametrize("weights", [(1.0, 1.0, 0.0), (1.0, 10.0, 1.0)])
def test_padding_graphs_change_no_loss_or_gradient(weights):
    """An empty graph of weight 0 (a smaller last batch padded to batch_size graphs): the same loss
    and gradient as the batch without it, in float64, the stress term included (an empty graph's
    zero cell gives a NaN stress, which must not reach the gradient)."""
    import jax

    from e3j_models import Potential

    with jax.enable_x64(True):
        structures = emt_structures(3, repeats=[(1, 1, 2), (2, 1, 2)])
        for a in structures:
            a.calc.results["stress"] = a.get_stress()
        cfg = prepare_config(nequip((28, 29), **TINY), structures)
        pot = Potential(cfg)
        graphs = [_checked_graph(a, cfg.atomic_numbers, cfg.cutoff, np.float64) for a in structures]
        shape = (64, 2048)
        plain = _batch(structures, [0, 2, 1], shape, cfg, np.float64, None, graphs)
        padded = _batch(structures, [0, 2, 1], shape, cfg, np.float64, None, graphs, num_graphs=5)
        assert padded[0].num_graphs == 5 and plain[0].num_graphs == 3
        params = pot.init(jax.random.key(0), jax.device_put(plain[0]), dtype=np.float64)

        def loss(p, b):
            return loss_fn(pot, p, *jax.device_put(b), weights)[0]

        want, want_grad = jax.value_and_grad(loss)(params, plain)
        got, got_grad = jax.value_and_grad(loss)(params, padded)
    assert np.isfinite(float(want)) and float(want) > 0
    np.testing.assert_allclose(float(got), float(want), rtol=1e-12)
    for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad), strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)


def test_batch_structures_pads_graphs():
    structures = emt_structures(2, repeats=[(1, 1, 2)])
    b = batch_structures(structures, (28, 29), 3.0, num_graphs=4)
    assert b.num_graphs == 4 and b.cell.shape == (4, 3, 3)
    np.testing.assert_array_equal(b.cell[2:], 0)
    assert int(np.max(b.node_graph)) == 1  # padding nodes join a structure's graph, masked out
    with pytest.raises(ValueError, match=r"num_graphs=1 cannot hold 2 structures"):
        batch_structures(structures, (28, 29), 3.0, num_graphs=1)
    with pytest.raises(ValueError, match=r"num_graphs must be an int > 0 or None, got 0"):
        batch_structures(structures, (28, 29), 3.0, num_graphs=0)


def test_epoch_loss_does_not_depend_on_the_batches_membership():
    """With the parameters held (a learning rate of 1e-12), every epoch's loss is the loss of all
    training structures as one batch, in float64, while the mean of its per-step losses moves with
    the epoch's batches (a batch's forces are a mean over its atoms)."""
    import jax

    from e3j_models import Potential

    with jax.enable_x64(True):
        structures = emt_structures(9, repeats=[(1, 1, 2), (2, 1, 2), (2, 2, 2)])
        train, valid = structures[:7], structures[7:]
        kw = {"steps": 9, "batch_size": 2, "progress": False, "dtype": np.float64, "learning_rate": 1e-12}
        result = fit(nequip((28, 29), **TINY), train, valid, weights=(1.0, 10.0, 0.0), **kw)
        cfg = result.config
        ((batch, labels),) = _batches(train, cfg, len(train), None, np.float64, cfg.atomic_energies)
        pot = Potential(dataclasses.replace(cfg, atomic_energies=None))
        whole = float(loss_fn(pot, result.params, *jax.device_put((batch, labels)), (1.0, 10.0, 0.0))[0])
    losses = np.asarray(result.history["train_loss"])
    assert result.history["steps_per_epoch"] == 4 and len(result.history["epoch_loss"]) == 2
    np.testing.assert_allclose(result.history["epoch_loss"], whole, rtol=1e-9)
    np.testing.assert_allclose(epoch_losses(result.history), whole, rtol=1e-9)
    per_step = losses[:8].reshape(2, 4).mean(axis=1)
    assert abs(per_step[0] / per_step[1] - 1) > 1e-3, per_step  # what the epoch loss is free of


def test_prefetched_batches_keep_their_order_raise_and_stop():
    import threading
    import time

    from e3j_models._batching import _prefetched

    assert list(_prefetched(iter(range(7)), depth=2)) == list(range(7))

    def failing():
        yield 1
        raise RuntimeError("structure 3 is bad")

    got = _prefetched(failing(), depth=2)
    assert next(got) == 1
    with pytest.raises(RuntimeError, match="structure 3 is bad"):
        next(got)
    drawn = []

    def endless():
        for k in itertools.count():
            drawn.append(k)
            yield k

    got = _prefetched(endless(), depth=2)
    assert [next(got) for _ in range(3)] == [0, 1, 2]
    got.close()
    time.sleep(0.5)
    n = len(drawn)
    time.sleep(0.3)
    assert len(drawn) == n <= 3 + 2 + 1, drawn  # stopped: at most depth + 1 drawn ahead
    assert not any(t.name == "e3j_models-batches" and t.is_alive() for t in threading.enumerate())


def test_cached_graphs_are_narrow_and_batch_as_built():
    """The graphs fit keeps for a run hold indices and shifts in their narrowest integer types
    (5 bytes per edge below 128 atoms, 7 below 32,768; int64 and float64 took 40), and batch exactly
    as batch_structures builds them, offsets past int16 included."""
    from e3j_models.neighbours import _assemble

    structures = emt_structures(3, repeats=[(2, 2, 2), (1, 1, 2), (3, 3, 2)])
    cfg = nequip((28, 29), **{**TINY, "cutoff": 5.0})
    graphs = [_checked_graph(a, cfg.atomic_numbers, cfg.cutoff, np.float64) for a in structures]
    for g in graphs:
        s, r, shifts = g[4:]
        assert len(s) > 30 * len(g[0])  # edges outnumber atoms
        assert (s.nbytes + r.nbytes + shifts.nbytes) / len(s) == 5
    group = [2, 0, 1]
    got = _batch(structures, group, (256, 16384), cfg, np.float64, None, graphs)[0]
    want = batch_structures(
        [structures[k] for k in group], cfg.atomic_numbers, cfg.cutoff, num_nodes=256, num_edges=16384
    )
    _assert_batches_equal(got, want)

    # 300 atoms (int16 indices) 120 times: offsets up to 35,700
    chain = {"positions": np.arange(300.0)[:, None] * np.array([1.0, 0.5, 0.0]), "numbers": np.full(300, 28)}
    one = _checked_graph(chain, (28,), 1.5, np.float64)
    assert one[4].dtype == np.int16 and one[6].dtype == np.int8
    got = _assemble([one] * 120, {28: 0}, None, None, 0.1, np.float64, 120)
    want = batch_structures([chain] * 120, (28,), 1.5)
    assert int(np.max(np.asarray(got.graph.senders)[np.asarray(got.graph.edge_mask)])) == 36000 - 1
    _assert_batches_equal(got, want)


def _assert_batches_equal(got, want):
    import jax

    paths = jax.tree_util.tree_flatten_with_path(want)[0]
    for (path, b), a in zip(paths, jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def _keep_state_at(monkeypatch, step: int) -> dict:
    """``fit``'s state file as written after ``step`` steps (``["bytes"]`` of the returned dict),
    kept while the run goes on and overwrites it."""
    from e3j_models import _train_state

    kept, original = {}, _train_state.save_state

    def keeping(path, header, *args):
        original(path, header, *args)
        if header["step"] == step:
            kept["bytes"] = open(path, "rb").read()

    monkeypatch.setattr("e3j_models.train.save_state", keeping)
    return kept


def test_a_resumed_run_ends_as_the_run_that_was_not_stopped(monkeypatch, tmp_path):
    """fit stopped after 4 of 7 steps (its state kept as it was then) and resumed from that state
    ends with the uninterrupted run's parameters, optimizer step, history and checkpoint, bit for
    bit: the same batches at the same steps (2 per epoch here: the stop falls inside one, whose loss sums
    so far the state keeps),
    the same learning rate schedule."""
    import jax

    from e3j_models import load

    structures = emt_structures(5, repeats=[(1, 1, 2), (2, 1, 2)])
    train, valid = structures[:3], structures[3:]
    cfg = nequip((28, 29), **TINY)
    kept = _keep_state_at(monkeypatch, 3)
    args = dict(steps=7, batch_size=2, eval_every=2, progress=False, state_every=3)
    whole = fit(cfg, train, valid, state=tmp_path / "a.npz", checkpoint=tmp_path / "a_model.npz", **args)
    (tmp_path / "b.npz").write_bytes(kept["bytes"])
    with pytest.raises(FileNotFoundError, match=r"state .*nope.npz' does not exist: nothing to resume"):
        fit(cfg, train, valid, state=tmp_path / "nope.npz", resume=True, **args)
    resumed = fit(cfg, train, valid, state=tmp_path / "b.npz", checkpoint=tmp_path / "b_model.npz", resume=True, **args)
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(whole.params), strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.history["train_loss"] == whole.history["train_loss"]
    assert resumed.history["epoch_loss"] == whole.history["epoch_loss"]
    assert resumed.history["valid"] == whole.history["valid"] and resumed.validation == whole.validation
    assert resumed.history["padding"] == whole.history["padding"]
    b_model, a_model = load(tmp_path / "b_model.npz")[1], load(tmp_path / "a_model.npz")[1]
    for a, b in zip(jax.tree.leaves(b_model), jax.tree.leaves(a_model), strict=True):
        np.testing.assert_array_equal(a, b)
    # the run is checked: another run's state is refused, naming what differs
    with pytest.raises(ValueError, match=r"another run: seed: 0 there, 1 here; steps: 7 there, 8 here \(resume"):
        fit(cfg, train, valid, state=tmp_path / "b.npz", resume=True, **{**args, "steps": 8, "seed": 1})
    with pytest.raises(ValueError, match=r"another run: the training or validation data differ \("):
        fit(cfg, [*train[:2], valid[0]], valid, state=tmp_path / "b.npz", resume=True, **args)
    with pytest.raises(ValueError, match=r"another run: config.num_channels: 4 there, 6 here \("):
        other = nequip((28, 29), **{**TINY, "num_channels": 6})
        fit(other, train, valid, state=tmp_path / "b.npz", resume=True, **args)
    with pytest.raises(ValueError, match=r"resume=True needs state"):
        fit(cfg, train, valid, resume=True, **args)
    with pytest.raises(ValueError, match=r"another run: config_type_weights: None there, \{'Default': 2.0\} here"):
        fit(cfg, train, valid, state=tmp_path / "b.npz", resume=True, config_type_weights={"Default": 2.0}, **args)
    # a type of weight 1 weighs as one not given: the same run
    again = fit(cfg, train, valid, state=tmp_path / "b.npz", resume=True, config_type_weights={"Default": 1}, **args)
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(whole.params), strict=True):
        np.testing.assert_array_equal(a, b)
    # an edited header's step, or NaN parameters: numpy's and islice's errors, or a stop blaming the rate
    import json

    with np.load(io.BytesIO(kept["bytes"])) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(bytes(arrays["__header__"]).decode())
    for step in (-2, 99):
        edited = dict(arrays, __header__=np.frombuffer(json.dumps({**header, "step": step}).encode(), np.uint8))
        np.savez(tmp_path / "c.npz", **edited)
        with pytest.raises(
            ValueError, match=rf"state .*c.npz' is malformed: its step {step} is not an int in \[0, 7\]"
        ):
            fit(cfg, train, valid, state=tmp_path / "c.npz", resume=True, **args)
    name = next(k for k in arrays if k.startswith("params/") and arrays[k].dtype.kind == "f")
    np.savez(tmp_path / "c.npz", **{**arrays, name: np.full_like(arrays[name], np.nan)})
    with pytest.raises(ValueError, match=r"state .*c.npz' holds non-finite parameters: \['"):
        fit(cfg, train, valid, state=tmp_path / "c.npz", resume=True, **args)


def test_a_resumed_run_writes_a_checkpoint_given_only_now_from_the_states_best(monkeypatch, tmp_path):
    """A run with a state and no checkpoint, stopped after step 3 and resumed with a checkpoint,
    writes the uninterrupted run's checkpoint: the best validation (scripted here: step 2's, before
    the stop) is kept in the state with its parameters either way."""
    import jax

    from e3j_models import load
    from e3j_models import train as train_module

    structures = emt_structures(5, repeats=[(1, 1, 2), (2, 1, 2)])
    train, valid = structures[:3], structures[3:]
    cfg = nequip((28, 29), **TINY)
    real, calls = train_module.evaluate, []

    def scripted(potential, params, batches):  # worse at each validation: the first is the best
        val = real(potential, params, batches)
        calls.append(None)
        return {k: v + len(calls) for k, v in val.items()}

    monkeypatch.setattr("e3j_models.train.evaluate", scripted)
    kept = _keep_state_at(monkeypatch, 3)
    args = dict(steps=7, batch_size=2, eval_every=2, progress=False, state_every=3)
    fit(cfg, train, valid, checkpoint=tmp_path / "whole.npz", **args)  # validations at 2, 4, 6, 7
    calls.clear()
    fit(cfg, train, valid, state=tmp_path / "a.npz", **args)
    (tmp_path / "b.npz").write_bytes(kept["bytes"])
    calls[:] = [None]  # the resumed run validates at 4, 6 and 7 (and the end): scripted as the second on
    fit(cfg, train, valid, state=tmp_path / "b.npz", checkpoint=tmp_path / "resumed.npz", resume=True, **args)
    assert len(calls) == 5
    whole, resumed = (load(tmp_path / f"{n}.npz")[1] for n in ("whole", "resumed"))
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(whole), strict=True):
        np.testing.assert_array_equal(a, b)


def test_cli_train_resumes_a_stopped_run(monkeypatch, tmp_path):
    """`train --resume` goes on from --out/state.npz (kept as it was after 2 of 5 steps) and ends with
    the model and history of the run that was not stopped; without a state it is refused."""
    import json
    import os

    import jax

    from e3j_models import _train_state, load
    from e3j_models.__main__ import main
    from e3j_models.data import write_dataset

    data = tmp_path / "d.extxyz"
    write_dataset(data, emt_structures(6, repeats=[(1, 1, 2), (2, 1, 2)]))
    kept = {}
    original = _train_state.save_state

    def keeping(path, header, *args):
        original(path, header, *args)
        if header["step"] == 2:  # the state, and the best model so far
            kept["bytes"] = open(path, "rb").read()
            kept["model"] = open(os.path.join(os.path.dirname(path), "model.npz"), "rb").read()

    monkeypatch.setattr("e3j_models.train.save_state", keeping)
    args = ["train", "--data", str(data), "--preset", "nequip", "--channels", "2", "--layers", "1", "--l-max", "1"]
    args += ["--cutoff", "3.0", "--radial-hidden", "4", "--steps", "5", "--batch-size", "2", "--eval-every", "2"]
    args += ["--state-every", "2", "--valid-fraction", "0.34"]
    with pytest.raises(SystemExit, match=r"--resume: .*state.npz does not exist"):
        main([*args, "--out", str(tmp_path / "b"), "--resume"])
    main([*args, "--out", str(tmp_path / "a")])
    (tmp_path / "b").mkdir(exist_ok=True)
    (tmp_path / "b" / "state.npz").write_bytes(kept["bytes"])
    (tmp_path / "b" / "model.npz").write_bytes(kept["model"])
    main([*args, "--out", str(tmp_path / "b"), "--resume"])
    a, b = (json.loads((tmp_path / d / "history.json").read_text()) for d in "ab")
    assert b["train_loss"] == a["train_loss"] and len(a["train_loss"]) == 5 and b["valid"] == a["valid"]
    for x, y in zip(*(jax.tree.leaves(load(tmp_path / d / "model.npz")[1]) for d in "ab"), strict=True):
        np.testing.assert_array_equal(x, y)
    before = sorted(os.listdir(tmp_path / "b"))
    # named as the command line sets them
    with pytest.raises(SystemExit, match=r"another run: steps \(--steps\): 5 there, 6 here \(resume"):
        main([*("6" if a == "5" else a for a in args), "--out", str(tmp_path / "b"), "--resume"])
    wider = [*args[: args.index("--channels") + 1], "3", *args[args.index("--channels") + 2 :]]
    with pytest.raises(SystemExit, match=r"another run: config.num_channels \(--channels\): 2 there, 3 here"):
        main([*wider, "--out", str(tmp_path / "b"), "--resume"])
    assert sorted(os.listdir(tmp_path / "b")) == before  # a refused resume removes nothing
    assert "metrics.json" in before


def test_ema_is_the_moving_average_of_the_trained_parameters(monkeypatch, tmp_path):
    """ema_decay: training is unchanged (the raw parameters equal those of a run without it), and
    the returned, validated and saved parameters are torch_ema's average of the raw parameters after
    each step, computed here by hand in float64 from the start and the states of every step; a
    resumed run carries the average on."""
    import jax

    from e3j_models import Potential, _train_state, load
    from e3j_models.train import evaluate

    structures = emt_structures(5, repeats=[(1, 1, 2), (2, 1, 2)])
    train, valid = structures[:3], structures[3:]
    cfg = prepare_config(nequip((28, 29), **TINY), train)
    pot = Potential(dataclasses.replace(cfg, atomic_energies=None))
    start = pot.init(
        jax.random.key(3),
        jax.device_put(
            _batch(
                train,
                [0],
                (64, 4096),
                cfg,
                np.float32,
                None,
                [_checked_graph(train[0], cfg.atomic_numbers, cfg.cutoff, np.float32)],
            )[0]
        ),
    )
    raw = {}
    original = _train_state.save_state

    def recording(path, header, params, *args):
        original(path, header, params, *args)
        raw[header["step"]] = jax.tree.map(np.asarray, params)
        if header["step"] == 2:
            raw["state"] = open(path, "rb").read()

    monkeypatch.setattr("e3j_models.train.save_state", recording)
    args = dict(steps=5, batch_size=2, progress=False, params=start, learning_rate=2e-2)
    plain = fit(cfg, train, valid, **args)
    got = fit(
        cfg, train, valid, ema_decay=0.9, state=tmp_path / "s.npz", state_every=1, checkpoint=tmp_path / "m.npz", **args
    )
    for a, b in zip(jax.tree.leaves(raw[5]), jax.tree.leaves(plain.params), strict=True):
        np.testing.assert_array_equal(a, b)  # the average changes no step
    want = jax.tree.map(lambda a: np.asarray(a, np.float64), start)
    for n in range(1, 6):
        d = min(0.9, (1 + n) / (10 + n))
        want = jax.tree.map(lambda e, p, d=d: e - (1 - d) * (e - p), want, raw[n])
    moved = 0.0
    for a, b, c in zip(jax.tree.leaves(got.params), jax.tree.leaves(want), jax.tree.leaves(raw[5]), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7)
        moved = max(moved, float(np.max(np.abs(b - c))))
    assert moved > 1e-3  # the average is not the last parameters
    for a, b in zip(jax.tree.leaves(load(tmp_path / "m.npz")[1]), jax.tree.leaves(got.params), strict=True):
        np.testing.assert_array_equal(a, b)
    host = _batches(valid, cfg, 2, None, np.float32, cfg.atomic_energies, config_weights=False)
    assert got.validation == evaluate(pot, got.params, host) != plain.validation
    (tmp_path / "r.npz").write_bytes(raw["state"])
    resumed = fit(cfg, train, valid, ema_decay=0.9, state=tmp_path / "r.npz", resume=True, **args)
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(got.params), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"ema_decay must be in \(0, 1\) or None"):
        fit(cfg, train, valid, ema_decay=1.0, **args)


def test_resuming_a_finished_run_restores_its_checkpoint(tmp_path):
    """A state written at the last step resumes to the same parameters and validation with no step
    taken (it drew a batch past the run's last, of a shape the run never planned), and writes the
    best model again where it was lost; a state that fit did not write is refused, named."""
    import jax

    from e3j_models import load

    structures = emt_structures(5, repeats=[(1, 1, 1), (3, 3, 3)])  # 4 and 108 atoms: far apart buckets
    train, valid = structures[:3], structures[3:]
    cfg = nequip((28, 29), **TINY)
    args = dict(steps=2, batch_size=1, eval_every=1, progress=False, state=tmp_path / "s.npz")
    whole = fit(cfg, train, valid, checkpoint=tmp_path / "m.npz", **args)
    again = fit(cfg, train, valid, checkpoint=tmp_path / "lost.npz", resume=True, **args)
    assert again.validation == whole.validation and again.history["valid"] == whole.history["valid"]
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(whole.params), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(*(jax.tree.leaves(load(tmp_path / f)[1]) for f in ("lost.npz", "m.npz")), strict=True):
        np.testing.assert_array_equal(a, b)
    np.savez(tmp_path / "junk.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match=r"junk.npz' is not a training state \(no __header__\)"):
        fit(cfg, train, valid, **{**args, "state": tmp_path / "junk.npz"}, resume=True)
    with pytest.raises(ValueError, match=r"m.npz' has format 'e3j-models', expected 'e3j-models-train-state'"):
        fit(cfg, train, valid, **{**args, "state": tmp_path / "m.npz"}, resume=True)
