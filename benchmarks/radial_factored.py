"""e3j-models with the radial MLP's last layer fused into the convolution, against materialized scalars.

    python benchmarks/radial_factored.py [--models mace_a nequip] [--atoms 250 1000] [--pairs 10]
                                         [--train] [--backend reference]
                                         [--out benchmarks/results/cpu-radial-factored.json]

``e3j_models.Interaction`` gives its convolution the edge scalars as ``e3j.FactoredWeights(hidden,
kernel)`` (the radial MLP's last hidden layer and last kernel): on the reference backend each chunk
of edges' scalars is computed inside the convolution's sweep, and the ``[E, num_paths, C]`` array is
neither written nor kept for the backward. "array" is the route before: the same model and
parameters with the scalars multiplied out (``hidden @ kernel``, what ``nn.Dense`` computes) and
given to the convolution as an array (``Potential(..., factored_radial=False)``).

For each model preset (Table 3 sizes) and atom count (a water box, as ``models_vs_e3nn.py``):
jitted energy + forces, and with ``--train`` the gradient of the training loss (energy and forces,
with respect to the parameters: the forces' derivative differentiated again). Both variants
compiled, then ``--pairs`` alternating calls of each: the median over the pairs of ``1 - factored /
array`` and its quartiles (positive: the fused model is faster), each variant's median ms, XLA's
temporary memory of each compiled program, and the largest difference of their outputs.

``--backend`` names the backend both variants run on (default ``reference``). On one without
factored kernels (every GPU and TPU backend; on a CPU the ``test`` plugin of ``tests/plugins``,
the reference's kernels without the factored ones) the factored variant multiplies the scalars
out once per primitive call and forms the factors' cotangents from the weights' summed cotangent.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from interop_message_passing import paired_share
from models_vs_e3nn import PRESETS, machine_info

import e3j_models as em
from e3j_models.train import Labels, loss_fn


def _shares(paired: dict) -> dict:
    """``paired_share``'s result named for this script: ``1 - factored / array`` and each one's ms."""
    return {
        "share_median": paired["median"],
        "share_q1": paired["q1"],
        "share_q3": paired["q3"],
        "array_ms": round(paired["a_ms"], 1),
        "factored_ms": round(paired["b_ms"], 1),
    }


def programs(pot, train: bool):
    def forces(params, batch, labels):
        out = pot(params, batch)
        return out["energy"], out["forces"]

    def gradient(params, batch, labels):
        return jax.grad(lambda p: loss_fn(pot, p, batch, labels)[0])(params)

    return {"energy_forces": forces} | ({"train_gradient": gradient} if train else {})


def measure(model: str, atoms: int, pairs: int, train: bool, backend: str = "reference") -> list[dict]:
    cfg = PRESETS[model]((1, 8))
    batch = em.batch_structures([em.water_box(atoms)], cfg.atomic_numbers, cfg.cutoff, dtype=np.float32)
    pots = {v: em.Potential(cfg, backend, factored_radial=v == "factored") for v in ("array", "factored")}
    params = pots["factored"].init(jax.random.key(0), batch, dtype=np.float32)
    num_graphs, nodes = batch.num_graphs, batch.node_mask.shape[0]
    labels = Labels(
        energy=jnp.zeros(num_graphs),
        num_atoms=jnp.full(num_graphs, float(batch.node_mask.sum())),
        forces=jnp.zeros((nodes, 3)),
        stress=jnp.zeros((num_graphs, 3, 3)),
        has_stress=jnp.asarray(False),
    )
    args = (params, batch, labels)
    rows = []
    for name in programs(pots["array"], train):
        compiled = {v: jax.jit(programs(pot, train)[name]).lower(*args).compile() for v, pot in pots.items()}
        outs = {v: jax.block_until_ready(c(*args)) for v, c in compiled.items()}
        diff = max(
            float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(a)) + 1e-30))
            for a, b in zip(jax.tree.leaves(outs["array"]), jax.tree.leaves(outs["factored"]), strict=True)
        )
        row = {
            "model": model,
            "backend": backend,
            "atoms": int(batch.node_mask.sum()),
            "edges": int(batch.graph.num_valid),
            "program": name,
            **_shares(paired_share((compiled["array"], args), (compiled["factored"], args), pairs)),
            "pairs": pairs,
            "array_temp_mib": round(compiled["array"].memory_analysis().temp_size_in_bytes / 2**20, 1),
            "factored_temp_mib": round(compiled["factored"].memory_analysis().temp_size_in_bytes / 2**20, 1),
            "max_rel_diff": diff,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["mace_a", "nequip"], choices=sorted(PRESETS))
    ap.add_argument("--atoms", nargs="+", type=int, default=[250, 1000])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--train", action="store_true", help="also the training loss's gradient")
    ap.add_argument("--backend", default="reference", help="the backend both variants run on")
    ap.add_argument("--out", help="write the rows here (JSON)")
    args = ap.parse_args(argv)
    rows = [r for m in args.models for n in args.atoms for r in measure(m, n, args.pairs, args.train, args.backend)]
    if args.out:
        result = {
            "machine": machine_info(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": "python benchmarks/radial_factored.py " + " ".join(argv if argv is not None else []),
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
