"""The part of TensorProduct and Convolution that is the same: one cached COO descriptor (private)."""

from __future__ import annotations

from collections.abc import Iterable

from e3j_core import Irreps, Path, TensorProductCoo, tensor_product_coo


class CooOp:
    """An op defined by ``tensor_product_coo(irreps_x, irreps_y, filter, ...)``."""

    def __init__(
        self,
        irreps_x: Irreps | str | Iterable,
        irreps_y: Irreps | str | Iterable,
        filter: Irreps | str | Iterable | None = None,
        *,
        normalization: str = "component",
        regroup_output: bool = True,
    ) -> None:
        self.coo: TensorProductCoo = tensor_product_coo(
            irreps_x, irreps_y, filter, normalization=normalization, regroup_output=regroup_output
        )

    @classmethod
    def from_coo(cls, coo: TensorProductCoo):
        """The op of a prebuilt descriptor, e.g. one reordered by :func:`e3j_core.select_paths`."""
        if not isinstance(coo, TensorProductCoo):
            raise TypeError(f"coo must be an e3j_core.TensorProductCoo, got {type(coo).__name__}")
        op = cls.__new__(cls)
        op.coo = coo
        return op

    @property
    def irreps_x(self) -> Irreps:
        return self.coo.irreps_x

    @property
    def irreps_y(self) -> Irreps:
        return self.coo.irreps_y

    @property
    def irreps_out(self) -> Irreps:
        return self.coo.irreps_out

    @property
    def num_paths(self) -> int:
        return self.coo.num_paths

    @property
    def path_slices(self) -> tuple[slice, ...]:
        """The output rows of each path."""
        return self.coo.path_slices

    @property
    def paths(self) -> tuple[Path, ...]:
        return self.coo.paths

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.irreps_x} ⊗ {self.irreps_y} -> {self.irreps_out}, {self.num_paths} paths)"

    # equal ops compute the same thing: the descriptor defines the op, and as a static `jit`
    # argument an op built again with the same arguments must not compile again
    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.coo == self.coo

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.coo))
