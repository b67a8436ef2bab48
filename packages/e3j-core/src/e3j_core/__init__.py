"""e3j-core: the static math of e3j, in numpy only.

Irreps in e3nn's notation, real spherical harmonics as exact polynomials, Clebsch–Gordan
coefficients, real-basis Wigner D matrices and the COO coefficient tables that every e3j kernel
consumes. All of it is computed on the host before tracing, and cached. Also the check every kernel
package makes at import that the installed JAX is in its declared range (:mod:`e3j_core.dependencies`).

>>> import e3j_core
>>> coo = e3j_core.tensor_product_coo("0e + 1o", "0e + 1o", filter="0e + 1o")
>>> coo.irreps_out
2x0e+2x1o
"""

from ._version import __version__
from .clebsch_gordan import change_basis_real_to_complex, clebsch_gordan, su2_clebsch_gordan
from .coo import (
    COO_FORMAT_VERSION,
    TP_NORMALIZATIONS,
    CooTable,
    Path,
    TensorProductCoo,
    select_paths,
    tensor_product_coo,
    unpack_records,
)
from .dependencies import IncompatibleDependency, check_dependency, declared_range
from .irreps import Irrep, Irreps, MulIrrep, as_irreps
from .spherical_harmonics import (
    NORMALIZATIONS,
    SphericalHarmonicPolynomials,
    SphericalHarmonicRecurrence,
    spherical_harmonic_polynomials,
    spherical_harmonic_recurrence,
    spherical_harmonics,
)
from .wigner import (
    angles_to_matrix,
    matrix_to_log_coordinates,
    matrix_x,
    matrix_y,
    matrix_z,
    so3_generators,
    wigner_D,
    wigner_D_from_angles,
    wigner_D_from_log_coordinates,
)

__all__ = [
    "COO_FORMAT_VERSION",
    "NORMALIZATIONS",
    "TP_NORMALIZATIONS",
    "CooTable",
    "IncompatibleDependency",
    "Irrep",
    "Irreps",
    "MulIrrep",
    "Path",
    "SphericalHarmonicPolynomials",
    "SphericalHarmonicRecurrence",
    "TensorProductCoo",
    "__version__",
    "angles_to_matrix",
    "as_irreps",
    "change_basis_real_to_complex",
    "check_dependency",
    "clebsch_gordan",
    "declared_range",
    "matrix_to_log_coordinates",
    "matrix_x",
    "matrix_y",
    "matrix_z",
    "select_paths",
    "so3_generators",
    "spherical_harmonic_polynomials",
    "spherical_harmonic_recurrence",
    "spherical_harmonics",
    "su2_clebsch_gordan",
    "tensor_product_coo",
    "unpack_records",
    "wigner_D",
    "wigner_D_from_angles",
    "wigner_D_from_log_coordinates",
]
