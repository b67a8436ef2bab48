import copy
import pickle

import e3nn_jax as e3nn
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e3j_core import Irrep, Irreps, MulIrrep

STRINGS = [
    "",
    "0e",
    "1o",
    "2x0e + 1o",
    "2x0e+1x1o+0x2e",
    "1o + 0e + 2e + 0e + 1e",
    "3y + 2y + 0y",
    "  4x3o +2x1e+ 0x0o ",
    "1e + 1e + 0e + 1e",
    "1e + 0x0e + 1e",
    "10x5e + 3x11o + 0e",
]


@pytest.mark.parametrize("text", STRINGS)
def test_parse_and_print_like_e3nn(text):
    ours, ref = Irreps(text), e3nn.Irreps(text)
    assert str(ours) == str(ref)
    assert ours.dim == ref.dim
    assert ours.num_irreps == ref.num_irreps
    assert ours.ls == list(ref.ls)
    if ours:
        assert ours.lmax == ref.lmax
    assert ours.slices() == list(ref.slices())
    assert str(ours.simplify()) == str(ref.simplify())
    assert str(ours.regroup()) == str(ref.regroup())
    sorted_ours, sorted_ref = ours.sort(), ref.sort()
    assert str(sorted_ours.irreps) == str(sorted_ref.irreps)
    assert sorted_ours.p == tuple(sorted_ref.p)
    assert sorted_ours.inv == tuple(sorted_ref.inv)


def test_irrep_order_matches_e3nn():
    names = [f"{l}{p}" for l in range(6) for p in "eo"]
    rng = np.random.default_rng(0)
    rng.shuffle(names)
    assert [str(ir) for ir in sorted(Irrep(n) for n in names)] == [
        str(ir) for ir in sorted(e3nn.Irrep(n) for n in names)
    ]
    assert [str(ir) for ir in Irrep.iterator(2)] == ["0e", "0o", "1o", "1e", "2e", "2o"]


def test_irrep_basics():
    assert Irrep("3y") == Irrep(3, -1) == Irrep((3, -1)) == "3o"
    assert Irrep("2y") == Irrep("2e")
    assert Irrep("2e").dim == 5
    assert Irrep("0e").is_scalar() and not Irrep("0o").is_scalar()
    assert [str(ir) for ir in Irrep("1o") * Irrep("2o")] == ["1e", "2e", "3e"]
    # n * Irrep is Irreps, as in e3nn-jax (it was a MulIrrep pair: `3 * ir + 2 * ir2` a 4-tuple)
    assert 3 * Irrep("1o") + 2 * Irrep("0e") == Irreps("3x1o + 2x0e") == 3 * e3nn.Irrep("1o") + 2 * e3nn.Irrep("0e")
    assert isinstance(3 * Irrep("1o"), Irreps) and 3 * Irrep("1o") + "0e" == "3x1o + 0e"
    with pytest.raises(ValueError, match="multiplicity"):
        -1 * Irrep("1o")
    with pytest.raises(TypeError):
        True * Irrep("1o")
    assert {Irrep("1o"): 1}[Irrep(1, -1)] == 1
    l, p = Irrep("2o")
    assert (l, p) == (2, -1)
    with pytest.raises(AttributeError):
        Irrep("1o").l = 2  # type: ignore[misc]


def test_e3nn_reads_e3j_irreps():
    # an Irrep is the pair (l, p), so e3nn-jax's constructors take e3j's irreps as they are
    for text in ["64x0e + 32x1o + 16x2e", "0x1e + 2x3o", "", "1o + 1o + 0e"]:
        assert e3nn.Irreps(Irreps(text)) == e3nn.Irreps(text)
    for ir in ["0e", "0o", "1o", "2e", "5o"]:
        assert e3nn.Irrep(Irrep(ir)) == e3nn.Irrep(ir)
    assert e3nn.IrrepsArray(Irreps("2x1o"), np.zeros(6)).irreps == e3nn.Irreps("2x1o")


def test_irrep_is_a_pair_not_a_tuple_otherwise():
    ir = Irrep("1o")
    assert isinstance(ir, tuple) and len(ir) == 2 and ir == (1, -1)
    # comparisons are the irreps', never the tuples'
    assert ir != "1e" and ir != (1, 1) and not (ir != "1o") and not (ir != (1, -1))
    assert Irrep("1e") > Irrep("1o") and not Irrep("2e") < Irrep("1e")
    assert ir != (1, -1, 0) and ir != "not an irrep" and ir != 3
    # a sum is a direct sum (e3nn-jax's meaning), not a concatenation of pairs
    assert ir + "0e" == Irreps("1o + 0e") and "0e" + ir == Irreps("0e + 1o")
    assert ir + Irreps("2x2e") == Irreps("1o + 2x2e")
    # a list of irreps is irreps, not (mul, ir) pairs
    assert Irreps([Irrep("1o"), Irrep("2e")]) == Irreps("1o + 2e")
    assert Irreps([(2, Irrep("1o"))]) == Irreps("2x1o")
    assert pickle.loads(pickle.dumps(ir)) == ir and type(copy.deepcopy(ir)) is Irrep
    # rebuilt by type as a namedtuple is (JAX's pytrees, Flax's frozen module attributes)
    assert type(jax.tree.map(lambda v: v, ir)) is Irrep and jax.tree.map(lambda v: v, ir) == ir
    with pytest.raises(AttributeError):
        ir.anything = 1  # type: ignore[attr-defined]


def test_mul_irreps_order_like_e3nn():
    # a NamedTuple compares its multiplicity first; e3nn-jax orders by irrep, then multiplicity
    for text in ("2x1o + 1x0e + 3x0e", "1x2e + 4x1e + 2x1o + 2x0o + 5x0e + 1x1o"):
        ours, ref = list(Irreps(text)), list(e3nn.Irreps(text))
        assert [str(m) for m in sorted(ours)] == [str(m) for m in sorted(ref)]
        assert str(max(ours)) == str(max(ref)) and str(min(ours)) == str(min(ref))
    a, b = MulIrrep(3, Irrep("0e")), MulIrrep(2, Irrep("1o"))
    assert a < b and a <= b and b > a and b >= a and not b < a
    assert hash(a) == hash((3, Irrep("0e"))) and a == (3, Irrep("0e"))


def test_filter_like_e3nn():
    ours, ref = Irreps("1e + 2e + 0e + 3x1o"), e3nn.Irreps("1e + 2e + 0e + 3x1o")
    for kwargs in [
        {"keep": ["0e", "1e"]},
        {"keep": "2e + 2x1e"},
        {"drop": "2e + 2x1e"},
        {"lmax": 1},
        {"keep": "1o"},
        {"keep": lambda mul_ir: mul_ir.mul > 1},
        # e3nn-jax's Irrep and MulIrrep are tuples: read whole, not iterated as (l, p) / (mul, ir)
        {"keep": e3nn.Irrep("1o")},
        {"drop": e3nn.Irreps("2x1o")[0]},
        {"keep": [e3nn.Irrep("0e"), e3nn.Irrep("2e")]},
    ]:
        assert str(ours.filter(**kwargs)) == str(ref.filter(**kwargs))
    for name in ("keep", "drop"):  # a string's parse error names the argument too
        with pytest.raises(ValueError, match=rf"{name}: cannot interpret '2z' as a set of irreps"):
            ours.filter(**{name: "2z"})
    with pytest.raises(ValueError, match="keep and drop"):
        ours.filter(keep="0e", drop="1e")
    with pytest.raises(ValueError, match="lmax"):
        ours.filter(lmax=-1)


def test_concatenation_multiplication_and_membership():
    a = Irreps("0e + 1o")
    assert a + "2e" == Irreps("0e + 1o + 2e")
    assert "2e" + a == Irreps("2e + 0e + 1o")
    # * multiplies the multiplicities, as in e3nn-jax (a tuple's * would repeat the blocks)
    b = Irreps("2x1o + 3x0e")
    assert b * 2 == 2 * b == Irreps("4x1o + 6x0e") == e3nn.Irreps("2x1o + 3x0e") * 2
    assert b * 0 == Irreps("0x1o + 0x0e") and Irreps("12x0e + 14x1e") // 2 == e3nn.Irreps("12x0e + 14x1e") // 2
    with pytest.raises(ValueError, match="n >= 0"):
        b * -1
    with pytest.raises(TypeError, match="an int n >= 0"):
        b * 1.5
    with pytest.raises(ValueError, match="n > 0, got 0"):
        b // 0
    # numpy integers on the left defer to e3j (numpy multiplied the pairs as an array)
    assert np.int64(2) * b == b * 2 and np.int64(3) * Irrep("1o") == Irreps("3x1o")
    assert not Irreps("").is_scalar() and Irreps("2x0e + 0e").is_scalar()
    assert Irreps("").is_scalar() == e3nn.Irreps("").is_scalar()
    assert "1o" in a and "2e" not in a
    assert Irreps("2x1o + 1o").count("1o") == 3
    assert a[1:] == Irreps("1o") and a[0] == MulIrrep(1, Irrep("0e"))
    assert Irreps.spherical_harmonics(3) == Irreps("0e + 1o + 2e + 3o")
    assert Irreps.spherical_harmonics(2, p=1) == Irreps("0e + 1e + 2e")
    assert Irreps(e3nn.Irreps("2x0e + 1o")) == "2x0e + 1o"
    assert Irreps([(2, "0e"), "1o", Irrep("2e"), (1, (3, -1))]) == "2x0e + 1o + 2e + 3o"
    assert hash(Irreps("0e+1o")) == hash(Irreps("1x0e + 1x1o"))


@pytest.mark.parametrize(
    "text, token",
    [
        ("2x1q", "1q"),
        ("1x", "''"),
        ("x1e", "''"),
        ("-1e", "-1e"),
        ("1.5e", "1.5e"),
        ("1e + + 0e", "empty term"),
        ("ax1e", "'a'"),
        ("-2x1e", "'-2'"),
        ("2x1e + 3xo", "'o'"),
        ("e", "'e'"),
        ("²x1o", "invalid multiplicity '²'"),  # a digit to str.isdigit, not to int()
        ("1²o", "1²o"),
        # e3nn-jax reads a degree with int(): it takes "1 o" as 1o and "1_0e" as 10e
        ("1 o", "'1 o'"),
        ("2x1_0e", "'1_0e'"),
        ("2_0x1o", "'2_0'"),
    ],
)
def test_malformed_strings_name_the_bad_token(text, token):
    """Strings are read strictly (docs/inputs.md), where e3nn-jax's reading is looser."""
    with pytest.raises(ValueError) as info:
        Irreps(text)
    assert token in str(info.value)


@pytest.mark.parametrize(
    "args",
    [(-1, 1), (1, 2), (1.0, 1), ("1", None), (True, 1), (None, None)],
)
def test_bad_irrep(args):
    with pytest.raises(ValueError):
        Irrep(*args) if args[1] is not None else Irrep(args[0])


def test_bad_irreps_items():
    with pytest.raises(ValueError, match="multiplicity"):
        Irreps([(-1, "1o")])
    with pytest.raises(ValueError):
        Irreps([(1, "1o", 3)])
    with pytest.raises(ValueError):
        Irreps(3.5)
    with pytest.raises(ValueError, match="lmax"):
        Irreps("").lmax


irreps_strategy = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.sampled_from("eoy")), max_size=8).map(
    lambda items: " + ".join(f"{m}x{l}{p}" for m, l, p in items)
)


@settings(max_examples=60, deadline=None)
@given(irreps_strategy)
def test_property_roundtrip_and_sort(text):
    ours = Irreps(text)
    assert Irreps(str(ours)) == ours
    srt = ours.sort()
    assert [srt.p[i] for i in srt.inv] == list(range(len(ours)))
    assert [ours[i] for i in srt.inv] == list(srt.irreps)
    assert [mi.ir for mi in srt.irreps] == sorted(mi.ir for mi in ours)
    assert srt.irreps.dim == ours.dim
    regrouped = ours.regroup()
    assert str(regrouped) == str(e3nn.Irreps(text).regroup())
    assert len({ir for _, ir in regrouped}) == len(regrouped)
    assert regrouped.num_irreps == ours.num_irreps


def test_numpy_integers_are_taken_as_python_ints():
    # degrees and multiplicities often come from numpy (array sizes, np.arange); bools and floats are not ints
    assert Irrep(np.int64(2), -1) == Irrep(2, -1) and type(Irrep(np.int64(2), -1).l) is int
    assert Irreps.spherical_harmonics(np.int32(2)) == Irreps.spherical_harmonics(2)
    assert Irreps([(np.int64(3), (1, -1))]) == Irreps("3x1o") and type(Irreps([(np.int64(3), (1, -1))])[0].mul) is int
    assert Irreps("0e + 1o + 2e").filter(lmax=np.int64(1)) == Irreps("0e + 1o")
    for bad in (lambda: Irrep(np.bool_(True), 1), lambda: Irreps([(2.0, (0, 1))])):
        with pytest.raises(ValueError, match="int"):
            bad()


@pytest.mark.parametrize(
    "items",
    [
        [[2, "1o"], [1, "0e"]],  # (mul, ir) pairs as lists: irreps loaded from JSON or YAML
        [[1, (0, 1)], [3, (2, -1)]],
        [(1, (0, 1))],
        [0, 1, 3],  # lone degrees, read as even by e3nn-jax
        (0, 1),
    ],
)
def test_list_forms_read_as_e3nn_reads_them(items):
    assert str(Irreps(items)) == str(e3nn.Irreps(items))


def test_no_irreps_equals_none():
    assert Irreps("") != None  # noqa: E711 (== None, as e3nn-jax answers it)
    assert e3nn.Irreps("") != None  # noqa: E711
    assert Irreps("") == Irreps() == "" and Irreps(None) == []
