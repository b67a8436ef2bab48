"""The architectures: :class:`MACE` and :class:`NequIP` (Flax modules giving node energies)."""

from .mace import MACE
from .nequip import NequIP

__all__ = ["MACE", "NequIP"]
