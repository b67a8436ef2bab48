"""``select_paths``: a descriptor restricted to some paths, in a chosen order.

Oracle: the dense table of the original descriptor, whose output blocks are moved by hand.
"""

import numpy as np
import pytest

from e3j_core import select_paths, tensor_product_coo


@pytest.mark.parametrize("regroup", [True, False])
def test_selected_paths_are_the_original_blocks_in_the_new_order(regroup):
    coo = tensor_product_coo("2x0e + 1o + 2e", "0e + 1o + 0e", regroup_output=regroup)
    rng = np.random.default_rng(0)
    order = [int(i) for i in rng.permutation(coo.num_paths)[: coo.num_paths - 3]]
    sel = select_paths(coo, order)
    dense, sel_dense = coo.table.dense(), sel.table.dense()
    expected = np.concatenate([dense[coo.path_slices[i]] for i in order])
    np.testing.assert_array_equal(sel_dense, expected)
    assert [p._replace(out_start=0) for p in sel.paths] == [coo.paths[i]._replace(out_start=0) for i in order]
    assert np.all(np.diff(sel.i3) >= 0) and np.all(np.diff(sel.table.i0) >= 0)
    assert sel.irreps_out.dim == sel.dim_out == sum(coo.paths[i].ir_out.dim for i in order)
    # selecting again composes with the first selection, and equal selections are one object
    again = select_paths(sel, [1, 0])
    assert again is select_paths(coo, [order[1], order[0]])
    assert select_paths(coo, range(coo.num_paths)) is coo
    assert sel != coo and hash(sel) != hash(coo)


def test_select_paths_bad_order():
    coo = tensor_product_coo("0e + 1o", "1o")
    for bad in ([], [0, 0], [coo.num_paths], ["a"]):
        with pytest.raises(ValueError, match="order must"):
            select_paths(coo, bad)
    with pytest.raises(TypeError, match="TensorProductCoo"):
        select_paths("0e", [0])
