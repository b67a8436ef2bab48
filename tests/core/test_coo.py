import math

import e3nn_jax as e3nn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e3j_core import COO_FORMAT_VERSION, Irreps, clebsch_gordan, tensor_product_coo, unpack_records

CASES = [
    ("2x0e+2x0o+1o+1e+2e+2o", "0e+1o+2e", None),
    ("1o+0e+2x1o+0x2e+0e", "3x0e+1e+1o", "0e+1o+2e"),
    ("0e+1o+2e+3o", "0e+1o+2e+3o", "0e+1o+2e+3o"),
    ("0e+1o+2e+3o", "0e+1o+2e+3o", None),
    ("4x1e", "2x2o", ["1o", "3o"]),
    ("0e", "0e", None),
]


def e3nn_tp(ix, iy, x, y, f, regroup=True, normalization="component"):
    out = e3nn.tensor_product(
        e3nn.IrrepsArray(ix, x),
        e3nn.IrrepsArray(iy, y),
        filter_ir_out=f,
        regroup_output=regroup,
        irrep_normalization=normalization,
    )
    return str(out.irreps), np.asarray(out.array)


@pytest.mark.parametrize("normalization", ["component", "norm", "none"])
@pytest.mark.parametrize("regroup", [True, False])
@pytest.mark.parametrize("ix, iy, f", CASES)
def test_matches_e3nn_tensor_product(ix, iy, f, regroup, normalization):
    coo = tensor_product_coo(ix, iy, f, regroup_output=regroup, normalization=normalization)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, Irreps(ix).dim))
    y = rng.normal(size=(4, Irreps(iy).dim))
    ref_irreps, ref = e3nn_tp(ix, iy, x, y, f, regroup, normalization)
    assert str(coo.irreps_out) == ref_irreps
    np.testing.assert_allclose(coo.table(x, y), ref, atol=1e-13)


def test_regroup_output_is_read_as_a_flag():
    # numpy's bool is a bool (as every e3j flag, and e3nn-jax, read it); other values a TypeError
    ix, iy, f = CASES[0]
    assert tensor_product_coo(ix, iy, f, regroup_output=np.bool_(False)) == tensor_product_coo(
        ix, iy, f, regroup_output=False
    )
    for bad in ("no", 1):
        with pytest.raises(TypeError, match=f"regroup_output must be a bool, got {bad!r}"):
            tensor_product_coo(ix, iy, f, regroup_output=bad)


@pytest.mark.parametrize("ix, iy, f", CASES)
def test_dense_equals_per_path_cg_blocks(ix, iy, f):
    coo = tensor_product_coo(ix, iy, f)
    expected = np.zeros(coo.table.dims)
    for p in coo.paths:
        cg = clebsch_gordan(p.ir_x.l, p.ir_y.l, p.ir_out.l) * math.sqrt(p.ir_out.dim)
        expected[p.out_slice, p.x_slice, p.y_slice] += np.transpose(cg, (2, 0, 1))
    np.testing.assert_allclose(coo.table.dense(), expected, atol=1e-15)


@pytest.mark.parametrize("ix, iy, f", CASES)
def test_structure(ix, iy, f):
    coo = tensor_product_coo(ix, iy, f)
    t = coo.table
    assert t.dims == (coo.irreps_out.dim, Irreps(ix).dim, Irreps(iy).dim)
    assert t.indices.dtype == np.int32 and t.coefficients.dtype == np.float64
    keys = list(zip(*t.indices.tolist()))
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert np.all(t.coefficients != 0)
    # paths tile the output in order; i3 is the path of each row
    starts = [s.start for s in coo.path_slices]
    assert starts == sorted(starts) and starts[0] == 0
    assert sum(s.stop - s.start for s in coo.path_slices) == coo.dim_out
    for p, s in enumerate(coo.path_slices):
        assert np.all(coo.i3[s] == p)
    assert [p.ir_out for p in coo.paths] == [ir for mul, ir in coo.irreps_out for _ in range(mul)]
    assert coo.format_version == COO_FORMAT_VERSION
    assert not t.indices.flags.writeable and not t.coefficients.flags.writeable


def test_vjp_tables_compute_the_gradients():
    coo = tensor_product_coo("2x0e+1o+2e", "0e+1o+2e", "0e+1o+1e+2e+3o")
    dense = coo.table.dense()
    rng = np.random.default_rng(1)
    x, y, dz = rng.normal(size=coo.dim_x), rng.normal(size=coo.dim_y), rng.normal(size=coo.dim_out)
    np.testing.assert_allclose(coo.vjp_x(y, dz), np.einsum("kij,j,k->i", dense, y, dz), atol=1e-13)
    np.testing.assert_allclose(coo.vjp_y(x, dz), np.einsum("kij,i,k->j", dense, x, dz), atol=1e-13)
    assert coo.vjp_x.dims == (coo.dim_x, coo.dim_y, coo.dim_out)
    assert coo.vjp_y.dims == (coo.dim_y, coo.dim_x, coo.dim_out)
    np.testing.assert_array_equal(coo.vjp_x.i0, np.sort(coo.table.i1))
    np.testing.assert_array_equal(coo.vjp_y.i0, np.sort(coo.table.i2))


def test_permutations_form_a_group():
    t = tensor_product_coo("0e+1o+2e", "1o+2e").table
    assert t.transpose(2).transpose(2) is t  # (i2, i1, i0) is an involution
    assert t.transpose(1).transpose(1).transpose(1) is t  # (i1, i2, i0) has order 3
    assert t.transpose(1).permute((0, 1, 2)) is t.transpose(1)
    swapped = t.transpose(1).transpose(2)  # d(dx)/d(dz): roles (i0; i2, i1)
    assert swapped.roles == (0, 2, 1)
    np.testing.assert_array_equal(swapped.dense(), np.transpose(t.dense(), (0, 2, 1)))
    again = t.transpose(2).transpose(2)
    np.testing.assert_array_equal(again.indices, t.indices)
    np.testing.assert_array_equal(again.coefficients, t.coefficients)
    assert t.transpose(1) == t.permute((1, 2, 0)) and hash(t.transpose(1)) == hash(t.permute((1, 2, 0)))
    assert t.transpose(1) != t.transpose(2)
    with pytest.raises(ValueError, match="permutation"):
        t.permute((0, 0, 1))
    with pytest.raises(ValueError, match="operand"):
        t.transpose(3)


def test_trilinear_table():
    coo = tensor_product_coo("0e+1o+2e+3o", "0e+1o+2e+3o", "0e+1o+2e+3o")
    assert coo.num_paths == 23 and coo.dim_out == 99
    tri = coo.trilinear
    assert tri.dims == (99, 16, 16, 23)
    rng = np.random.default_rng(2)
    x, y, s, dm = (rng.normal(size=d) for d in tri.dims[1:] + (99,))
    np.testing.assert_allclose(tri(x, y, s), coo.table(x, y) * s[coo.i3], atol=1e-13)
    dense = tri.dense()
    np.testing.assert_allclose(tri.transpose(1)(y, s, dm), np.einsum("aijp,j,p,a->i", dense, y, s, dm), atol=1e-12)
    np.testing.assert_allclose(tri.transpose(2)(x, s, dm), np.einsum("aijp,i,p,a->j", dense, x, s, dm), atol=1e-12)
    np.testing.assert_allclose(tri.transpose(3)(x, y, dm), np.einsum("aijp,i,j,a->p", dense, x, y, dm), atol=1e-12)
    assert tri.transpose(3).transpose(3).transpose(3).transpose(3) is tri
    assert tri != coo.table


def test_packing_roundtrip_and_index_width():
    small = tensor_product_coo("0e+1o+2e+3o", "0e+1o+2e+3o", "0e+1o+2e+3o")
    assert small.table.index_dtype == np.uint8
    large = tensor_product_coo("0e+1o+2e+3o", "0e+1o+2e+3o")  # D_out = 256 > 255
    assert large.dim_out > 255 and large.table.index_dtype == np.int32
    for table in (small.table, small.vjp_x, small.trilinear, large.table, large.vjp_y):
        for dtype in (np.float32, np.float64):
            records = table.packed(dtype)
            assert records.dtype.names == tuple(f"i{k}" for k in range(len(table.dims))) + ("c",)
            assert records.dtype["c"] == dtype and records.dtype["i0"] == table.index_dtype
            indices, coefficients = unpack_records(records)
            np.testing.assert_array_equal(indices, table.indices)
            np.testing.assert_allclose(coefficients, table.coefficients, rtol=1e-7 if dtype == np.float32 else 0)
            assert records is table.packed(dtype)
    with pytest.raises(ValueError, match="coefficient_dtype"):
        small.table.packed(np.int32)
    # C struct layouts (what the CUDA kernels load): {u8 i0, i1, i2; f32 c} is 8 bytes, c at offset 4
    assert small.table.record_dtype(np.float32).itemsize == 8 and small.table.record_dtype().fields["c"][1] == 4
    assert large.table.record_dtype(np.float32).itemsize == 16 and large.table.record_dtype().fields["c"][1] == 12
    assert small.table.record_dtype(np.float64).itemsize == 16 and small.trilinear.record_dtype().itemsize == 8
    assert large.table.record_dtype(np.float64).itemsize == 24


def test_groupings_reconstruct_records():
    t = tensor_product_coo("2x0e+1o+2e", "0e+1o+2e").table
    flat = [(i0, *rest) for i0, recs in t.by_i0 for rest in recs]
    assert flat == [(*idx, c) for idx, c in zip(zip(*t.indices.tolist()), t.coefficients.tolist())]
    flat2 = [(i0, i1, *rest) for i0, i1, recs in t.by_i0_i1 for rest in recs]
    assert flat2 == flat
    assert len({(i0, i1) for i0, i1, _ in t.by_i0_i1}) == len(t.by_i0_i1)
    assert all(isinstance(v, int) for v in flat[0][:3]) and isinstance(flat[0][3], float)


def test_cache_and_hash():
    a = tensor_product_coo("0e+1o", "1o", "0e + 1e")
    b = tensor_product_coo(Irreps("1x0e+1x1o"), "1x1o", ["1e", "0e"])
    assert a is b and a == b and hash(a) == hash(b)
    c = tensor_product_coo("0e+1o", "1o")
    assert a != c and {a: 1, c: 2}[b] == 1


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("1o", "1o", "1o"), {}, "filter 1o leaves no path"),
        (("1o", "1o", "3e"), {}, "outputs this product can have: 0e\\+1e\\+2e"),
        # blocks of multiplicity 0 reach nothing, so they do not count as possible outputs
        (("0x0e + 0x1o", "0e + 1o", "0e + 1o"), {}, r"filter 0e\+1o leaves no path .*can have: none\)"),
        (("0x0e + 1o", "0e", "0e"), {}, r"filter 0e leaves no path .*can have: 1o\)"),
        (("", "1o"), {}, "no path"),
        (("1o", "1o", "1q"), {}, "filter.*1q"),
        (("1o", "2x"), {}, "irreps_y"),
        (("1o", "1o"), {"normalization": "integral"}, "normalization"),
    ],
)
def test_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tensor_product_coo(*args, **kwargs)


irreps_strategy = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 3), st.sampled_from("eo")), min_size=1, max_size=4
).map(lambda items: " + ".join(f"{m}x{l}{p}" for m, l, p in items))


@settings(max_examples=25, deadline=None)
@given(irreps_strategy, irreps_strategy, st.booleans(), st.integers(0, 2**31 - 1))
def test_property_random_irreps(ix, iy, regroup, seed):
    rng = np.random.default_rng(seed)
    possible = sorted({ir for _, a in Irreps(ix) if _ for _, b in Irreps(iy) if _ for ir in a * b})
    if not possible:
        with pytest.raises(ValueError):
            tensor_product_coo(ix, iy, regroup_output=regroup)
        return
    f = [ir for ir in possible if rng.random() < 0.7] or possible[:1]
    coo = tensor_product_coo(ix, iy, f, regroup_output=regroup)
    x, y = rng.normal(size=Irreps(ix).dim), rng.normal(size=Irreps(iy).dim)
    ref_irreps, ref = e3nn_tp(ix, iy, x, y, [str(ir) for ir in f], regroup)
    assert str(coo.irreps_out) == ref_irreps
    np.testing.assert_allclose(coo.table(x, y), ref, atol=1e-12)
    dense = coo.table.dense()
    dz = rng.normal(size=coo.dim_out)
    np.testing.assert_allclose(coo.vjp_x(y, dz), np.einsum("kij,j,k->i", dense, y, dz), atol=1e-12)
    indices, coefficients = unpack_records(coo.table.packed(np.float64))
    np.testing.assert_array_equal(indices, coo.table.indices)
    np.testing.assert_array_equal(coefficients, coo.table.coefficients)


@pytest.mark.parametrize(
    "irreps_x, irreps_y, filter_",
    [
        ("1o", "1o", "0e + 1e + 2e"),
        ("0e + 1o + 2e + 3o", "0e + 1o + 2e + 3o", "0e + 1o + 2e + 3o"),
        ("2x1o + 2e", "1o", None),
    ],
)
def test_contract_vjp_equals_the_transposed_contractions(irreps_x, irreps_y, filter_):
    t = tensor_product_coo(irreps_x, irreps_y, filter=filter_).table
    rng = np.random.default_rng(7)
    a, b, g = rng.normal(size=t.dims[1]), rng.normal(size=t.dims[2]), rng.normal(size=t.dims[0])
    dense = t.dense()
    reads, rows = [], {}
    da, db = t.contract_vjp(
        lambda i: a[i], lambda i: b[i], lambda i: reads.append(i) or g[i], on_row=lambda i0, v: rows.update({i0: v})
    )
    assert sorted(reads) == sorted(set(t.i0.tolist())), "each g row is read exactly once"
    expect_a, expect_b = np.einsum("kij,j,k->i", dense, b, g), np.einsum("kij,i,k->j", dense, a, g)
    np.testing.assert_allclose([da.get(i, 0.0) for i in range(t.dims[1])], expect_a, atol=1e-12)
    np.testing.assert_allclose([db.get(i, 0.0) for i in range(t.dims[2])], expect_b, atol=1e-12)
    # the forward rows handed to on_row are contract()'s
    forward = t.contract(lambda i: a[i], lambda i: b[i])
    assert rows.keys() == forward.keys()
    np.testing.assert_allclose([rows[i] for i in forward], [forward[i] for i in forward], atol=1e-12)
    # the transposed tables give the same cotangents
    via_vjp = t.transpose(1).contract(lambda i: b[i], lambda i: g[i])
    np.testing.assert_allclose([da[i] for i in via_vjp], [via_vjp[i] for i in via_vjp], atol=1e-12)
    only_b = t.contract_vjp(lambda i: a[i], lambda i: b[i], lambda i: g[i], grads=("b",))
    assert only_b[0] == {} and only_b[1].keys() == db.keys()


@pytest.mark.parametrize(
    "irreps_x, irreps_y, filter_",
    [("0e + 1o + 2e + 3o", "0e + 1o + 2e + 3o", "0e + 1o + 2e + 3o"), ("2x1o + 2e", "1o", None)],
)
def test_contract_hands_each_row_over_once_done(irreps_x, irreps_y, filter_):
    """on_row gets every row with records once, in output order, with its final value, before any
    record of a later row is read (so a kernel storing it there holds one output row at a time)."""
    t = tensor_product_coo(irreps_x, irreps_y, filter=filter_).table
    rng = np.random.default_rng(8)
    a, b = rng.normal(size=t.dims[1]), rng.normal(size=t.dims[2])
    events = []
    rows = t.contract(
        lambda i: a[i], lambda i: events.append(("read", i)) or b[i], on_row=lambda i0, v: events.append((i0, v))
    )
    handed = [(e[0], e[1]) for e in events if e[0] != "read"]
    assert [i0 for i0, _ in handed] == sorted(set(t.i0.tolist()))
    np.testing.assert_allclose([v for _, v in handed], [rows[i0] for i0, _ in handed], atol=0)
    dense = t.dense()
    np.testing.assert_allclose([rows[i] for i in rows], [a @ dense[i] @ b for i in rows], atol=1e-12)
    # between two handed rows, only the later row's records are read
    i0_of_read = iter(t.i0.tolist())
    for e in events:
        if e[0] == "read":
            current = next(i0_of_read)
        else:
            assert e[0] == current, "a row was handed over before its last record, or after a later row's"


def test_contract_vjp_rejects_bad_arguments():
    coo = tensor_product_coo("1o", "1o", filter="0e")
    with pytest.raises(ValueError, match="grads must name operands 'a' and/or 'b', got \\['x'\\]"):
        coo.table.contract_vjp(lambda i: 1.0, lambda i: 1.0, lambda i: 1.0, grads=("x",))
    with pytest.raises(ValueError, match="contract_vjp needs a bilinear table, got arity 3"):
        coo.trilinear.contract_vjp(lambda i: 1.0, lambda i: 1.0, lambda i: 1.0)
