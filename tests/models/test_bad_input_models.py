"""e3j-models' public functions and modules on bad input, and every irreps form they take.

Each bad call raises a named exception whose message names the argument; each irreps argument
takes a string, e3j's or e3nn-jax's ``Irreps``, or ``(mul, (l, p))`` pairs, with equal results.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bad_input import FORMS, KEY, f32, f64, ones, rand

import e3j
import e3j_models as M
from e3j_models.data import emt_structures

GRAPH = e3j.Graph.from_edges(np.array([0, 1, 2]), np.array([1, 2, 0]), num_nodes=3)


def _apply(module, *args):
    return module.apply(module.init(KEY, *args), *args)


FORM_CALLS = {
    "gate_irreps_in": lambda v: jnp.asarray(M.gate_irreps_in(v).ls),
    "gate": lambda v: M.gate(rand(5, M.gate_irreps_in("0e + 1o").dim, 2), v),
    "SymmetricContractionSpec": lambda v: jnp.asarray(M.SymmetricContractionSpec(v, v, 2).irreps_result.ls),
    "SymmetricContraction": lambda v: _apply(M.SymmetricContraction(v, v, 2, 2), rand(5, 4, 3), jnp.arange(5) % 2),
    "EquivariantLinear": lambda v: _apply(M.EquivariantLinear(v, v, 3), rand(5, 4, 2)),
    "Interaction": lambda v: _apply(
        M.Interaction(v, v, v, v, channels=2, radial_hidden=(4,)), rand(3, 4, 2), rand(3, 4, seed=1), rand(3, 5), GRAPH
    ),
}


@pytest.mark.parametrize("call", list(FORM_CALLS))
def test_every_irreps_form_gives_the_same_result(call):
    results = {form: FORM_CALLS[call](value) for form, value in FORMS.items()}
    reference = results.pop("str")
    for form, result in results.items():
        np.testing.assert_array_equal(result, reference, err_msg=f"{call} with irreps given as {form}")


POS = np.random.default_rng(0).normal(size=(4, 3))
SPECIES = [0, 0, 1, 1]
CFG = M.mace_a((1, 8), num_channels=4, radial_mlp=(4,), l_max=1, num_layers=1, correlation=1, node_symmetry=1)
POT = M.Potential(CFG)
BATCH = M.make_batch(POS, SPECIES, [0, 1, 2, 3], [1, 2, 3, 0])
PARAMS = POT.init(KEY, BATCH)  # float64, as the positions


def _interaction(x=None, sh=None, radial=None, graph=GRAPH, **kw):
    args = {"irreps_in": "0e + 1o", "irreps_sh": "0e + 1o", "filter": "0e + 1o", "irreps_out": "0e + 1o"}
    module = M.Interaction(**{**args, **kw}, channels=2, radial_hidden=(4,))
    x = rand(3, 4, 2) if x is None else x
    sh = rand(3, 4) if sh is None else sh
    radial = rand(3, 5) if radial is None else radial
    return module.init_with_output(KEY, x, sh, radial, graph)[0]


def _sc(x=None, species=None, **kw):
    module = M.SymmetricContraction(
        **{"irreps_in": "0e + 1o", "irreps_out": "0e + 1o", "correlation": 2, "num_species": 2, **kw}
    )
    x = rand(5, 4, 3) if x is None else x
    species = jnp.arange(5) % 2 if species is None else species
    return module.init_with_output(KEY, x, species)[0]


def _embed(species, num_species=3):
    return M.SpeciesEmbedding(num_species, 4).init_with_output(KEY, species)[0]


def _h2o():
    return {"positions": np.array([[0.0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]]), "numbers": np.array([8, 1, 1])}


def _h2o_nl(receiver=1):
    return np.array([0, 1]), np.array([receiver, 0]), np.zeros((2, 3), int)


BAD = {
    # id: (call, exception, message fragment naming the argument)
    # make_batch
    "make_batch senders float": (
        lambda: M.make_batch(POS, SPECIES, [0.5, 1.0], [1, 2]),
        TypeError,
        r"senders must be an int array, got float64",
    ),
    "make_batch receivers float": (
        lambda: M.make_batch(POS, SPECIES, [0, 1], np.array([1.0, 2.0])),
        TypeError,
        r"receivers must be an int array",
    ),
    "make_batch species negative": (
        lambda: M.make_batch(POS, [0, 0, -1, 1], [0], [1]),
        ValueError,
        r"species must be model species indices >= 0, got -1",
    ),
    "make_batch node_graph float": (
        lambda: M.make_batch(POS, SPECIES, [0], [1], node_graph=[0.0, 0, 1, 1]),
        TypeError,
        r"node_graph must be an int array",
    ),
    # what the model cannot mask: non-finite coordinates, real edges into padding or across structures
    "make_batch positions NaN": (
        lambda: M.make_batch(np.where(np.arange(4)[:, None] == 2, np.nan, POS), SPECIES, [0], [1]),
        ValueError,
        r"positions must be finite, got 3 non-finite values",
    ),
    "make_batch cell inf": (
        lambda: M.make_batch(POS, SPECIES, [0], [1], cell=np.full((3, 3), np.inf)),
        ValueError,
        r"cell must be finite",
    ),
    "make_batch real edge into padding": (
        lambda: M.make_batch(POS, SPECIES, [0, 3], [1, 0], node_mask=[True, True, True, False]),
        ValueError,
        r"edge 1 \(3 -> 0\) is real \(edge_mask\) but joins a padding node \(node_mask False\)",
    ),
    "make_batch edge across structures": (
        lambda: M.make_batch(POS, SPECIES, [0, 1], [1, 2], node_graph=[0, 0, 1, 1]),
        ValueError,
        r"edge 1 \(1 -> 2\) joins structures 0 and 1 of the batch",
    ),
    "make_batch zero-length edge": (
        # atom 3 on atom 2, and atom 1 one cell vector from atom 0: both real edges have length 0
        lambda: M.make_batch(np.where(np.arange(4)[:, None] == 3, POS[2], POS), SPECIES, [0, 2, 3], [1, 3, 2]),
        ValueError,
        r"edge 1 \(2 -> 3\) is real \(edge_mask\) but has length 0 \(positions, shifts, cell\): coincident atoms",
    ),
    "make_batch zero-length periodic edge": (
        lambda: M.make_batch(
            np.array([[0.0, 0, 0], [2.0, 0, 0]]), [0, 0], [0], [1], shifts=[[1, 0, 0]], cell=np.diag([2.0, 5, 5])
        ),
        ValueError,
        r"edge 0 \(0 -> 1\) is real \(edge_mask\) but has length 0",
    ),
    "make_batch Cartesian shifts": (
        # another code's shifts (unit shifts @ cell): the image edge would land beyond the cutoff
        lambda: M.make_batch(POS, SPECIES, [0, 1], [1, 0], shifts=[[0, 0, 0], [3.61, 0, 0]], cell=np.eye(3) * 3.61),
        ValueError,
        r"shifts must be integer cell images \(the edge's offset is shifts @ cell\), got \[3.61, 0.0, 0.0\] for edge 1",
    ),
    "make_batch float edge_mask": (
        lambda: M.make_batch(POS, SPECIES, [0, 1], [1, 0], edge_mask=[0.0, 0.5]),
        TypeError,
        r"edge_mask must be bool \[2\], got dtype float64",
    ),
    "make_batch string node_mask": (
        lambda: M.make_batch(POS, SPECIES, [0], [1], node_mask=["True", "True", "True", "False"]),
        TypeError,
        r"node_mask must be bool \[N=4\], got dtype <U5",
    ),
    "make_batch node_graph out of range": (
        lambda: M.make_batch(POS, SPECIES, [0], [1], node_graph=[0, 0, 5, 1], num_graphs=2),
        ValueError,
        r"node_graph must be in \[0, num_graphs=2\), got values in \[0, 5\]",
    ),
    # radial
    "bessel_basis r list": (lambda: M.bessel_basis([1.0, 2.0], 4, 5.0), TypeError, r"r must be an array, got list"),
    "bessel_basis r int": (
        lambda: M.bessel_basis(jnp.array([1, 2]), 4, 5.0),
        TypeError,
        r"r must be a floating-point array, got dtype int",
    ),
    "bessel_basis num_basis 0": (
        lambda: M.bessel_basis(ones(3), 0, 5.0),
        ValueError,
        r"num_basis must be an int > 0, got 0",
    ),
    "bessel_basis num_basis 2.0": (
        lambda: M.bessel_basis(ones(3), 2.0, 5.0),
        ValueError,
        r"num_basis must be an int > 0, got 2.0",
    ),
    "bessel_basis cutoff 0": (
        lambda: M.bessel_basis(ones(3), 4, 0.0),
        ValueError,
        r"cutoff must be a finite number > 0, got 0.0",
    ),
    "radial_embedding cutoff -1": (
        lambda: M.radial_embedding(ones(3), 4, -1.0),
        ValueError,
        r"cutoff must be a finite number > 0, got -1.0",
    ),
    "radial_embedding r None": (
        lambda: M.radial_embedding(None, 4, 5.0),
        TypeError,
        r"r must be an array, got NoneType",
    ),
    "radial_embedding p 0": (
        lambda: M.radial_embedding(ones(3), 4, 5.0, p=0),
        ValueError,
        r"p must be an int > 0 .*got 0",
    ),
    "radial_embedding mask int": (
        lambda: M.radial_embedding(ones(3), 4, 5.0, mask=jnp.array([1, 0, 2])),
        ValueError,
        r"mask must be a bool array shaped like r \(3,\), got int",
    ),
    "radial_embedding mask shape": (
        lambda: M.radial_embedding(ones(3), 4, 5.0, mask=jnp.array([True, False])),
        ValueError,
        r"mask must be a bool array shaped like r \(3,\), got bool \(2,\)",
    ),
    "polynomial_envelope p 2.5": (
        lambda: M.polynomial_envelope(ones(3), 5.0, p=2.5),
        ValueError,
        r"p must be an int > 0 .*got 2.5",
    ),
    # gate, linear, symmetric contraction, embedding, interaction
    "gate irreps_out": (lambda: M.gate(ones(5, 4, 2), "2z"), ValueError, r"irreps_out: invalid irrep '2z'"),
    "gate_irreps_in irreps_out": (lambda: M.gate_irreps_in("1x"), ValueError, r"irreps_out: invalid irrep ''"),
    "gate x list": (lambda: M.gate(np.ones((5, 5, 2)).tolist(), "0e + 1o"), TypeError, r"x must be an array, got list"),
    "gate x None": (lambda: M.gate(None, "0e + 1o"), TypeError, r"x must be an array, got NoneType"),
    "EquivariantLinear irreps_in": (
        lambda: _apply(M.EquivariantLinear("2z", "0e", 3), ones(5, 4, 2)),
        ValueError,
        r"irreps_in: invalid irrep '2z'",
    ),
    "EquivariantLinear irreps_out": (
        lambda: _apply(M.EquivariantLinear("0e + 1o", [(1, (0, 2))], 3), ones(5, 4, 2)),
        ValueError,
        r"irreps_out: Irrep parity",
    ),
    "EquivariantLinear x list": (
        lambda: _apply(M.EquivariantLinear("0e + 1o", "0e", 3), np.ones((5, 4, 2)).tolist()),
        TypeError,
        r"x must be an array, got list",
    ),
    "EquivariantLinear x None": (
        lambda: _apply(M.EquivariantLinear("0e + 1o", "0e", 3), None),
        TypeError,
        r"x must be an array, got NoneType",
    ),
    "SymmetricContractionSpec irreps_in": (
        lambda: M.SymmetricContractionSpec("2z", "0e", 2),
        ValueError,
        r"irreps_in: invalid irrep '2z'",
    ),
    "SymmetricContractionSpec irreps_out": (
        lambda: M.SymmetricContractionSpec("0e", "-1x0e", 2),
        ValueError,
        r"irreps_out: invalid multiplicity '-1'",
    ),
    "SymmetricContraction species float": (
        lambda: _sc(species=jnp.array([0.0, 1, 0, 1, 0])),
        TypeError,
        r"species must be an integer array, got dtype float",
    ),
    "SymmetricContraction species list": (
        lambda: _sc(species=[0, 1, 0, 1, 0]),
        TypeError,
        r"species must be an integer array, got list",
    ),
    "SymmetricContraction species shape": (
        lambda: _sc(species=jnp.array([0, 1])),
        ValueError,
        r"species must have shape \[N=5\] like x, got shape \(2,\)",
    ),
    "SymmetricContraction x list": (
        lambda: _sc(x=np.ones((5, 4, 3)).tolist()),
        TypeError,
        r"x must be an array, got list",
    ),
    "SymmetricContraction num_species 0": (
        lambda: _sc(num_species=0),
        ValueError,
        r"num_species must be an int > 0, got 0",
    ),
    "SpeciesEmbedding species float": (
        lambda: _embed(jnp.array([0.0, 1.0])),
        TypeError,
        r"species must be an integer array, got dtype float",
    ),
    "SpeciesEmbedding species list": (lambda: _embed([0, 1]), TypeError, r"species must be an integer array, got list"),
    "SpeciesEmbedding species 2-D": (
        lambda: _embed(jnp.array([[0, 1]])),
        ValueError,
        r"species must have shape \[N\], got shape \(1, 2\)",
    ),
    "SpeciesEmbedding num_species 0": (
        lambda: _embed(jnp.array([0]), num_species=0),
        ValueError,
        r"num_species must be an int > 0, got 0",
    ),
    "Interaction irreps_sh": (lambda: _interaction(irreps_sh="2z"), ValueError, r"irreps_sh: invalid irrep '2z'"),
    "Interaction irreps_in": (lambda: _interaction(irreps_in=None), ValueError, r"irreps_in must be irreps"),
    "Interaction filter": (lambda: _interaction(filter="1x"), ValueError, r"filter: cannot interpret '1x'"),
    "Interaction radial rows": (
        lambda: _interaction(radial=rand(4, 5)),
        ValueError,
        r"radial must be \[E=3, num_basis\] \(one row per edge\), got \(4, 5\)",
    ),
    "Interaction radial rank": (
        lambda: _interaction(radial=rand(3)),
        ValueError,
        r"radial must have shape \[E, num_basis\], got shape \(3,\)",
    ),
    "Interaction radial list": (
        lambda: _interaction(radial=np.ones((3, 5)).tolist()),
        TypeError,
        r"radial must be an array, got list",
    ),
    "RadialMLP radial rank": (
        lambda: _apply(M.RadialMLP((4,), 2, 3), rand(6)),
        ValueError,
        r"radial must have shape \[E, num_basis\]",
    ),
    # potential
    "Potential batch None": (
        lambda: POT(PARAMS, None),
        TypeError,
        r"batch must be an e3j_models.GraphBatch \(see make_batch\), got NoneType",
    ),
    "Potential batch tuple": (
        lambda: POT(PARAMS, tuple(BATCH)),
        TypeError,
        r"batch must be an e3j_models.GraphBatch .*got tuple",
    ),
    "Potential.init batch dict": (
        lambda: POT.init(KEY, BATCH._asdict()),
        TypeError,
        r"batch must be an e3j_models.GraphBatch .*got dict",
    ),
    "Potential params None": (
        lambda: POT(None, BATCH),
        TypeError,
        r"params must be the dict Potential.init returns, got NoneType",
    ),
    "Potential.energy params list": (
        lambda: POT.energy([PARAMS], BATCH),
        TypeError,
        r"params must be the dict Potential.init returns, got list",
    ),
    "Potential positions narrower than params": (
        lambda: POT(PARAMS, BATCH._replace(positions=BATCH.positions.astype(f32))),
        TypeError,
        r"batch.positions are float32 but params are float64",
    ),
    # potential
    "Potential species out of range": (
        lambda: POT(PARAMS, M.make_batch(POS, [0, 0, 2, 1], [0, 1, 2, 3], [1, 2, 3, 0])),
        ValueError,
        r"batch.species must be in \[0, 2\) \(the model's atomic_numbers\), got 2",
    ),
    "Potential species negative": (  # would wrap around to the last species
        lambda: POT(
            PARAMS,
            M.make_batch(POS, [0, 0, 0, 1], [0, 1, 2, 3], [1, 2, 3, 0])._replace(species=jnp.array([0, -1, 0, 1])),
        ),
        ValueError,
        r"batch.species must be in \[0, 2\) \(the model's atomic_numbers\), got -1",
    ),
    "Potential.init float64 without x64": (
        lambda: _without_x64(lambda: POT.init(KEY, BATCH, dtype=jnp.float64)),
        ValueError,
        r"dtype=float64 needs JAX's 64-bit mode",
    ),
    "Potential.init dtype int": (
        lambda: POT.init(KEY, BATCH, dtype=jnp.int32),
        TypeError,
        r"dtype must be a floating dtype \(the parameters'\), got int32",
    ),
    "make_batch positions int": (
        lambda: M.make_batch(np.zeros((4, 3), int), SPECIES, [0], [1]),
        TypeError,
        r"positions must be a float \[N, 3\] array, got dtype int64",
    ),
    "make_batch num_graphs float": (
        lambda: M.make_batch(POS, SPECIES, [0], [1], num_graphs=2.0),
        ValueError,
        r"num_graphs must be an int > 0, got 2.0",
    ),
    "neighbour_list pbc 2": (
        lambda: M.neighbour_list(POS, 2.0, np.eye(3) * 5, pbc=[True, False]),
        ValueError,
        r"pbc must be a bool or 3 bools, got \[True, False\]",
    ),
    "neighbour_list pbc str": (  # truthy: "False" was periodic
        lambda: M.neighbour_list(POS, 2.0, np.eye(3) * 5, pbc="False"),
        ValueError,
        r"pbc must be a bool or 3 bools, got 'False'",
    ),
    "batch_structures pbc strs": (
        lambda: M.batch_structures(
            [{"positions": POS, "numbers": [1, 8, 1, 8], "cell": np.eye(3) * 5, "pbc": [True, "False", True]}],
            [1, 8],
            2.0,
        ),
        ValueError,
        r"pbc must be a bool or 3 bools, got \[True, 'False', True\]",
    ),
    "neighbour_list pbc 2 as int": (
        lambda: M.neighbour_list(POS, 2.0, np.eye(3) * 5, pbc=2),
        ValueError,
        r"pbc must be a bool or 3 bools, got 2",
    ),
    "neighbour_list positions complex": (  # numpy would drop the imaginary part with a warning
        lambda: M.neighbour_list(POS + 0j, 2.0),
        ValueError,
        r"positions must hold real numbers, got dtype complex128",
    ),
    "neighbour_list positions str": (  # numpy would parse them
        lambda: M.neighbour_list(POS.astype(str), 2.0),
        ValueError,
        r"positions must hold real numbers, got dtype <U",
    ),
    "neighbour_list cell complex": (
        lambda: M.neighbour_list(POS, 2.0, np.eye(3) * (5 + 1j), pbc=True),
        ValueError,
        r"cell must hold real numbers, got dtype complex128",
    ),
    "neighbour_list cutoff str": (
        lambda: M.neighbour_list(POS, "5"),
        ValueError,
        r"cutoff must be a finite number > 0",
    ),
    "config_to_dict dict": (
        lambda: M.config_to_dict({"model": "mace"}),
        TypeError,
        r"config must be a MACEConfig or NequIPConfig, got dict",
    ),
    # flags given as strings would read as True
    "mace include_pseudotensors str": (
        lambda: M.mace_a((1,), include_pseudotensors="False"),
        TypeError,
        r"include_pseudotensors must be a bool, got 'False'",
    ),
    "mace node_gating str": (
        lambda: M.mace_a((1,), node_gating="False"),
        TypeError,
        r"node_gating must be a bool, got 'False'",
    ),
    # batch_structures: each would put an atom or an edge in the wrong place without an error
    "batch_structures atomic_numbers repeat": (
        lambda: M.batch_structures([_h2o()], [1, 8, 1], 2.0),
        ValueError,
        r"atomic_numbers must not repeat, got \(1, 8, 1\)",
    ),
    "batch_structures atomic_numbers float": (
        lambda: M.batch_structures([_h2o()], [1.9, 8.0], 2.0),
        ValueError,
        r"atomic_numbers must be a non-empty tuple of ints in \[1, 118\]",
    ),
    "batch_structures numbers float": (
        lambda: M.batch_structures([{**_h2o(), "numbers": np.array([1.7, 8.2, 1.0])}], [1, 8], 2.0),
        TypeError,
        r"numbers must be integer atomic numbers, got dtype float64",
    ),
    "batch_structures neighbours past the structure": (
        lambda: M.batch_structures([_h2o(), _h2o()], [1, 8], 2.0, neighbours=[_h2o_nl(receiver=3), _h2o_nl()]),
        ValueError,
        r"neighbours \(structure 0\): receivers\[0\] = 3 is out of range for its 3 atoms",
    ),
    "batch_structures neighbours shifts": (
        lambda: M.batch_structures([_h2o()], [1, 8], 2.0, neighbours=[_h2o_nl()[:2] + (np.zeros((2, 2), int),)]),
        ValueError,
        r"neighbours \(structure 0\) must be senders \[E\], receivers \[E\], shifts \[E, 3\]",
    ),
    "batch_structures dtype int": (
        lambda: M.batch_structures([_h2o()], [1, 8], 2.0, dtype=np.int32),
        ValueError,
        r"dtype must be float32 or float64, got int32",
    ),
    "mace_a one atomic number": (
        lambda: M.mace_a(29),
        ValueError,
        r"atomic_numbers must be a non-empty tuple of ints in \[1, 118\], got 29",
    ),
    "nequip one atomic number": (lambda: M.nequip(29), ValueError, r"atomic_numbers must be a non-empty tuple"),
    "batch_structures num_nodes float": (
        lambda: M.batch_structures([_h2o()], [1, 8], 2.0, num_nodes=8.0),
        ValueError,
        r"num_nodes must be an int >= 0 or None, got 8.0",
    ),
    "Potential stress traced": (
        lambda: jax.jit(POT)(PARAMS, BATCH, stress=True),
        TypeError,
        r"stress must be a bool \(static under jit: jax.jit\(pot, static_argnames",
    ),
    # configs
    "nequip radial_mlp 0": (lambda: M.nequip((1,), radial_mlp=(0,)), ValueError, r"radial_mlp must be a tuple of"),
    "mace radial_mlp str": (lambda: M.mace_a((1,), radial_mlp="64"), ValueError, r"radial_mlp must be a tuple of"),
    "nequip atomic_energies str": (
        lambda: M.nequip((1, 8), atomic_energies=("a", "b")),
        ValueError,
        r"atomic_energies must be None or a tuple of finite numbers",
    ),
    "mace cutoff str": (
        lambda: M.mace_a((1,), cutoff="5"),
        ValueError,
        r"cutoff must be a finite number > 0 \(Å\), got '5'",
    ),
    "mace cutoff inf": (lambda: M.mace_a((1,), cutoff=float("inf")), ValueError, r"cutoff must be a finite number"),
    "nequip avg_num_neighbors 0": (
        lambda: M.nequip((1,), avg_num_neighbors=0),
        ValueError,
        r"avg_num_neighbors must be a finite number > 0, got 0",
    ),
    "mace node_symmetry bool": (lambda: M.mace_a((1,), node_symmetry=True), ValueError, r"node_symmetry must be"),
    "nequip node_irreps None": (lambda: M.nequip((1,), node_irreps=None), ValueError, r"node_irreps must be irreps"),
    "nequip atomic_energies NaN": (
        lambda: M.nequip((1,), atomic_energies=(float("nan"),)),
        ValueError,
        r"atomic_energies must be None or a tuple of finite numbers \(eV\), got \(nan,\)",
    ),
    # checked when built, not at the first call
    "Potential backend unknown": (
        lambda: M.Potential(M.nequip((1,)), backend="nope"),
        ValueError,
        r"backend must be None, 'e3nn' or an installed e3j backend: unknown e3j backend 'nope'",
    ),
    "Potential backend int": (
        lambda: M.Potential(M.nequip((1,)), backend=3),
        TypeError,
        r"backend must be None, 'e3nn' or an e3j backend name, got 3",
    ),
    "nequip node_irreps bad": (lambda: M.nequip((1,), node_irreps="2z"), ValueError, r"node_irreps: invalid irrep"),
    # the energy would be 0 at every geometry: the readout reads the 0e features
    "nequip node_irreps no 0e": (
        lambda: M.nequip((1,), node_irreps="0o + 1o + 0x0e"),
        ValueError,
        r"node_irreps must hold 0e features \(the energy is read from them\), got '0o \+ 1o \+ 0x0e'",
    ),
    # with 0e edge attributes only, features of other irreps stay zero
    # Cout is read from the weights: with none it was silently 1
    "E3jOps.linear no weights": (
        lambda: M.E3jOps().linear("0e", "1o", {}, jnp.ones((2, 1, 4))),
        ValueError,
        r"linear: weights is empty \(irreps_in and irreps_out have no irrep in common\)",
    ),
    "nequip node_irreps l_max 0": (
        lambda: M.nequip((1,), node_irreps="2x0e + 0o + 1o + 2e", l_max=0),
        ValueError,
        r"node_irreps '2x0e \+ 0o \+ 1o \+ 2e': with l_max 0 \(spherical harmonics 0e only\) the features of "
        r"0o, 1o, 2e are always zero; keep only 0e, or raise l_max",
    ),
    # neighbours
    "bucket_size n": (lambda: M.bucket_size(-1), ValueError, r"n must be an int >= 0, got -1"),
    "bucket_size multiple": (lambda: M.bucket_size(10, multiple=0), ValueError, r"multiple must be an int > 0, got 0"),
    "bucket_size headroom": (
        lambda: M.bucket_size(10, headroom=-1.0),
        ValueError,
        r"headroom must be a finite number >= 0, got -1.0",
    ),
    "bucket_size headroom inf": (
        lambda: M.bucket_size(10, headroom=float("inf")),
        ValueError,
        r"headroom must be a finite number >= 0, got inf",
    ),
    # float32 positions of atoms 1e-9 Å apart are equal: the model would drop their edge
    "batch_structures atoms coincide in float32": (
        lambda: M.batch_structures(
            [{"positions": np.array([[0.0, 0, 0], [1.0, 0, 0], [1.0 + 1e-9, 0, 0]]), "numbers": np.array([1, 8, 1])}],
            [1, 8],
            2.0,
            dtype=np.float32,
        ),
        ValueError,
        r"atoms [12] and [12] coincide \(distance 0\)",
    ),
    # the systems and the EMT data: numpy's errors named nothing, or a wrong system came back
    "water_box num_atoms 0": (lambda: M.water_box(0), ValueError, r"num_atoms must be an int > 0, got 0"),
    "water_box num_atoms float": (lambda: M.water_box(2.5), ValueError, r"num_atoms must be an int > 0, got 2.5"),
    "cuni_fcc repeats bool": (lambda: M.cuni_fcc(True), ValueError, r"repeats must be a positive int or 3"),
    "cuni_fcc lattice_constant nan": (
        lambda: M.cuni_fcc(1, lattice_constant=float("nan")),
        ValueError,
        r"lattice_constant must be a finite number > 0 \(Å\), got nan",
    ),
    "cuni_fcc lattice_constant 0": (
        lambda: M.cuni_fcc(1, lattice_constant=0.0),
        ValueError,
        r"lattice_constant must be a finite number > 0 \(Å\), got 0.0",
    ),
    "emt_structures max_vacancies -1": (
        lambda: emt_structures(1, max_vacancies=-1),
        ValueError,
        r"max_vacancies must be an int >= 0, got -1",
    ),
    "emt_structures max_vacancies too many": (
        lambda: emt_structures(1, repeats=[(1, 1, 1)], max_vacancies=4),
        ValueError,
        r"max_vacancies must be < 4, the atoms of the smallest supercell of repeats, got 4",
    ),
    "emt_structures seed -1": (lambda: emt_structures(1, seed=-1), ValueError, r"seed must be an int >= 0"),
    "emt_structures one repeats triple": (
        lambda: emt_structures(1, repeats=(2, 2, 2)),
        ValueError,
        r"repeats must be a non-empty list of 3 positive ints each, got \(2, 2, 2\)",
    ),
    "emt_structures repeats bool": (
        lambda: emt_structures(1, repeats=[(True, 1, 1)]),
        ValueError,
        r"repeats must be a non-empty list of 3 positive ints each",
    ),
}


def _without_x64(call):
    with jax.enable_x64(False):
        return call()


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_argument(case):
    call, exc, match = BAD[case]
    with pytest.raises(exc, match=match):
        call()


def test_valid_edge_cases():
    """What stays accepted: empty index lists, wider positions than params (promoted), 0 edges, a
    headroom too small to widen a size, atoms apart in float64 only when the batch is float64."""
    assert M.bucket_size(10, headroom=1e-17) == 16 and M.bucket_size(10, headroom=0.0) == 16
    assert M.bucket_size(100, headroom=np.array(0.25)) == M.bucket_size(100, headroom=0.25)  # 0-d arrays
    close = {"positions": np.array([[0.0, 0, 0], [1.0, 0, 0], [1.0 + 1e-9, 0, 0]]), "numbers": np.array([1, 8, 1])}
    assert int(M.batch_structures([close], [1, 8], 2.0).graph.num_valid) == 6
    assert M.make_batch(np.zeros((0, 3)), [], [], []).graph.num_nodes == 0
    empty = M.make_batch(np.zeros((0, 3)), [], [], [], node_mask=[], edge_mask=[])  # [] is float64 to numpy
    assert empty.node_mask.dtype == bool and empty.graph.num_edges == 0
    assert M.mace_a(range(28, 30)).atomic_numbers == (28, 29)  # a range is an ordered sequence
    assert M.make_batch(POS, SPECIES, [], []).graph.num_edges == 0
    params32 = jax.tree.map(lambda a: a.astype(f32) if jnp.issubdtype(a.dtype, jnp.floating) else a, PARAMS)
    assert POT(params32, BATCH, forces=False)["energy"].dtype == f64
    isolated = POT(PARAMS, M.make_batch(POS, SPECIES, [], []), forces=False)["energy"]
    assert np.isfinite(isolated).all()
    # forces/stress static, as the docstring says: the same numbers as the eager call
    jitted = jax.jit(POT, static_argnames=("forces", "stress"))(PARAMS, BATCH, forces=True)
    np.testing.assert_allclose(jitted["forces"], POT(PARAMS, BATCH)["forces"], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("form", list(FORMS))
def test_configs_take_every_form_and_save(tmp_path, form):
    """A config built from any irreps form, lists or numpy values is hashable (a Flax attribute) and
    survives save and load equal to the one built from plain strings, tuples and ints."""
    plain = M.nequip((1, 8), num_layers=1, node_irreps="0e + 1o", radial_mlp=(4,), atomic_energies=(-1.5, -2.0))
    cfg = M.nequip(
        np.array([1, 8]),
        num_layers=1,
        node_irreps=FORMS[form],
        radial_mlp=[4],
        atomic_energies=np.array([-1.5, -2.0], np.float32),
        cutoff=np.float32(5.0),
    )
    assert cfg == plain and hash(cfg) == hash(plain)
    params = M.Potential(cfg).init(jax.random.key(0), M.make_batch(np.zeros((1, 3)), [0], [], []))
    M.save(tmp_path / "m.npz", cfg, params)
    loaded, _ = M.load(tmp_path / "m.npz")
    assert loaded == plain


def test_numpy_scalars_are_taken_as_python_ones():
    # counts and flags often come from numpy (array sizes, np.unique, masks): the same model
    cfg = M.nequip(np.unique(np.array([8, 1, 1])), num_channels=np.int64(4), num_layers=np.int64(1),
                   radial_mlp=tuple(np.array([4])), l_max=np.int32(1))  # fmt: skip
    assert cfg == M.nequip((1, 8), num_channels=4, num_layers=1, radial_mlp=(4,), l_max=1)
    assert type(cfg.num_channels) is int and type(cfg.radial_mlp[0]) is int
    assert M.config_from_dict(M.config_to_dict(cfg)) == cfg
    mace = M.mace_a((1, 8), num_channels=4, correlation=np.int64(1), node_symmetry=np.int64(1), l_max=1,
                    node_gating=np.bool_(False))  # fmt: skip
    assert mace.node_gating is False and type(mace.correlation) is int
    got = POT(PARAMS, BATCH, forces=np.bool_(True), stress=np.bool_(False))
    want = POT(PARAMS, BATCH, forces=True, stress=False)
    np.testing.assert_array_equal(got["forces"], want["forces"])
    assert set(got) == set(want)


def test_given_neighbours_equal_computed_ones():
    structures = [_h2o(), {**_h2o(), "positions": _h2o()["positions"] * 1.1}]
    computed = M.batch_structures(structures, [1, 8], 2.0)
    given = M.batch_structures(
        structures, [1, 8], 2.0, neighbours=[M.neighbour_list(s["positions"], 2.0) for s in structures]
    )
    for a, b in zip(jax.tree.leaves(computed), jax.tree.leaves(given)):
        np.testing.assert_array_equal(a, b)


def test_numpy_reals_and_float_shifts_are_taken():
    structure = _h2o()
    nl = M.neighbour_list(structure["positions"], 2.0)
    # 0-d arrays too, as every real argument takes them (md's temperature_K and timestep_fs alike)
    for cutoff in (np.float32(2.0), np.int64(2), np.array(2.0), jnp.array(2.0)):
        got = M.neighbour_list(structure["positions"], cutoff)
        assert all(np.array_equal(a, b) for a, b in zip(got, nl))
    # shifts given as floats are cast with the positions, as make_batch does
    with_float_shifts = M.batch_structures([structure], [1, 8], 2.0, neighbours=[(nl[0], nl[1], nl[2].astype(float))])
    plain = M.batch_structures([structure], [1, 8], 2.0, neighbours=[nl])
    for a, b in zip(jax.tree.leaves(with_float_shifts), jax.tree.leaves(plain)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"neighbours \(structure 0\) must be \(senders, receivers, shifts\), got 2"):
        M.batch_structures([structure], [1, 8], 2.0, neighbours=[nl[:2]])
    assert M.mace_a((1, 8), cutoff=np.array(4.5)) == M.mace_a((1, 8), cutoff=4.5)
    energies = (np.array(-1.5), jnp.float32(-2.0))
    assert M.nequip((1, 8), atomic_energies=energies).atomic_energies == (-1.5, -2.0)
    for bad in (float("inf"), np.array([2.0]), np.array(True)):
        with pytest.raises(ValueError, match="cutoff must be a finite number > 0"):
            M.neighbour_list(structure["positions"], bad)


def test_make_batch_refuses_atoms_that_coincide_in_the_stored_dtype():
    # distinct in float64, the same float32 (what the batch holds without jax_enable_x64)
    positions = np.array([[1.0, 0.0, 0.0], [1.0 + 1e-9, 0.0, 0.0]])
    with jax.enable_x64(False), pytest.raises(ValueError, match=r"edge 0 \(0 -> 1\) is real .* has length 0"):
        M.make_batch(positions, [0, 0], [0], [1])
    assert M.make_batch(positions, [0, 0], [0], [1]).positions.dtype == jnp.float64  # x64: distinct


def test_masked_edges_may_touch_padding_nodes():
    """The consistency check reads only the real edges: a padding edge on padding nodes is fine."""
    b = M.make_batch(POS, SPECIES, [0, 3], [1, 3], node_mask=[True, True, True, False], edge_mask=[True, False])
    assert b.graph.num_edges == 2


def test_cuni_fcc_takes_any_sequence_of_repeats():
    assert len(M.cuni_fcc(np.array([1, 1, 2]))) == len(M.cuni_fcc(range(1, 4))) / 3 == len(M.cuni_fcc((1, 1, 2))) == 8
