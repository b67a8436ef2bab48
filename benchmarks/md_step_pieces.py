"""Where the e3j MD step of the committed ``cuni_mace`` goes, piece by piece (CPU, float32).

    python benchmarks/md_step_pieces.py [--repeats 8] [--rounds 7] [--only step convolution_1 ...]
        [--backend reference] [--json out.json]

Builds the committed ``cuni_mace`` checkpoint on a ``4·repeats³``-atom Cu–Ni fcc cell (2,048 atoms at
the default 8) and times, interleaved in rounds (best of ``--rounds``, one call each per round), the
whole energy + forces + stress step and each piece jitted alone with its backward (the value and the
vector-Jacobian product of a fixed random cotangent with respect to the piece's floating inputs, the
ones the forces depend on): edge vectors, spherical harmonics, radial embedding, species embedding
(forward only: it does not depend on positions), and per layer the interaction's parts (linear up,
radial MLP, convolution, linear down), the symmetric contraction, the linears, the gate and the
readout. Node features are the model's own intermediates (a forward pass of the pieces in order).
Prints one row per piece: ms of the best round, and its share of the whole step; ``--json`` also
writes them with the command, date and host. ``--backend``: the e3j backend of the convolutions
(default ``reference``, the CPU path, which a development environment's test plugin would otherwise
displace).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import e3j
import e3j_models as em
from e3j._bench import provenance
from e3j_core import tensor_product_coo
from e3j_models.embedding import SpeciesEmbedding
from e3j_models.gate import gate, gate_irreps_in
from e3j_models.interaction import RadialMLP
from e3j_models.linear import EquivariantLinear
from e3j_models.ops import get_ops
from e3j_models.radial import radial_embedding
from e3j_models.symmetric_contraction import SymmetricContraction, SymmetricContractionSpec

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = ROOT / "packages" / "e3j-models" / "checkpoints" / "cuni_mace" / "model.npz"


def _with_backward(fn, ctx, args, key):
    """Jitted ``(ctx, ct, *args) -> (fn(ctx, *args), vjp(ct))`` and a fixed random cotangent ``ct``.

    Everything is an argument, nothing a closed-over array: XLA would fold products of constants
    (weights, cotangent, graph indices) at compile time and time less than the step does.
    """
    out_shape = jax.eval_shape(fn, ctx, *args)
    ct = jax.tree.map(lambda s: jax.random.normal(key, s.shape, s.dtype), out_shape)

    def both(ctx_, ct_, *a):
        out, vjp = jax.vjp(lambda *a_: fn(ctx_, *a_), *a)
        return out, vjp(ct_)

    return jax.jit(both), (ctx, ct, *args)


def build_pieces(repeats: int, backend: str | None = None) -> dict:
    """``{name: (jitted fn, args)}``, in model order, the whole step first."""
    cfg, params = em.load(CHECKPOINT)
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    p = params["params"]
    batch = em.batch_structures([em.cuni_fcc(repeats)], cfg.atomic_numbers, cfg.cutoff, dtype=np.float32)
    pot = em.Potential(cfg, backend)
    ops = get_ops(backend)
    keys = iter(jax.random.split(jax.random.key(1), 64))
    pieces = {"step": (jax.jit(lambda prm, b: pot(prm, b, stress=True)), (params, batch))}

    def add(name, fn, w, *args):
        """Piece ``fn((w, batch), *args)``, differentiated with respect to ``args``; returns its value."""
        jitted, all_args = _with_backward(fn, (w, batch), args, next(keys))
        pieces[name] = (jitted, all_args)
        return jax.jit(fn)((w, batch), *args)

    def apply(module):
        return lambda ctx, *a: module.apply({"params": ctx[0]}, *a)

    vectors = add("edge_vectors", lambda ctx, pos: em.edge_vectors(pos, ctx[1].cell, ctx[1]), {}, batch.positions)
    sh = add("spherical_harmonics", lambda ctx, v: ops.spherical_harmonics(cfg.irreps_sh, v), {}, vectors)
    r2 = jnp.sum(vectors * vectors, axis=-1)
    r = jnp.sqrt(jnp.where(r2 > 0, r2, 1.0))

    def radial_fn(ctx, r_):
        mask = ctx[1].graph.edge_mask & (r_ != 1.0)  # r2 > 0 as edge_features has it (r = 1 where r2 = 0)
        return radial_embedding(r_, cfg.num_rbf, cfg.cutoff, cfg.envelope_p, mask)

    radial = add("radial_embedding", radial_fn, {}, r)
    emb = SpeciesEmbedding(len(cfg.atomic_numbers), cfg.num_channels)
    emb_fn = jax.jit(lambda w, s: emb.apply({"params": w}, s))
    pieces["embedding (fwd)"] = (emb_fn, (p["embedding"], batch.species))
    x = emb_fn(p["embedding"], batch.species)
    irreps_x, irreps_a, c = "0e", str(cfg.irreps_a), cfg.num_channels
    for t in range(cfg.num_layers):
        last = t == cfg.num_layers - 1
        hidden = "0e" if last else str(cfg.irreps_hidden)
        gated = cfg.node_gating and not last
        pi = p[f"interaction_{t}"]
        coo = tensor_product_coo(irreps_x, str(cfg.irreps_sh), irreps_a)
        h = add(f"linear_up_{t}", apply(EquivariantLinear(irreps_x, irreps_x, c, backend)), pi["linear_up"], x)
        mlp = RadialMLP(tuple(cfg.radial_mlp), coo.num_paths, c)
        s = add(f"radial_mlp_{t}", apply(mlp), pi["radial"], radial)
        conv_irreps = (irreps_x, str(cfg.irreps_sh), irreps_a)

        def conv_fn(ctx, h_, y_, s_, irreps=conv_irreps):
            return ops.convolution(*irreps, h_, y_, s_, ctx[1].graph) / cfg.avg_num_neighbors

        m = add(f"convolution_{t}", conv_fn, {}, h, sh, s)
        down = EquivariantLinear(str(coo.irreps_out), irreps_a, c, backend)
        a = add(f"linear_down_{t}", apply(down), pi["linear_down"], m)
        spec = SymmetricContractionSpec(irreps_a, hidden, cfg.correlation)
        prod = SymmetricContraction(irreps_a, hidden, cfg.correlation, len(cfg.atomic_numbers), backend)
        b = add(
            f"symmetric_contraction_{t}",
            lambda ctx, a_, mod=prod: mod.apply({"params": ctx[0]}, a_, ctx[1].species),
            p[f"product_{t}"],
            a,
        )
        irreps_h = str(gate_irreps_in(hidden)) if gated else hidden
        lin = EquivariantLinear(str(spec.irreps_result), irreps_h, c, backend)
        h = add(f"linear_{t}", apply(lin), p[f"linear_{t}"], b)
        if t > 0:
            h = h + add(f"skip_{t}", apply(EquivariantLinear(irreps_x, irreps_h, c, backend)), p[f"skip_{t}"], x)
        x = add(f"gate_{t}", lambda ctx, h_, hid=hidden: gate(h_, hid), {}, h) if gated else h
        irreps_x = hidden
        if last:
            r0 = EquivariantLinear("0e", "0e", cfg.readout_hidden, backend)
            r1 = EquivariantLinear("0e", "0e", 1, backend)

            def readout_fn(ctx, x_, r0=r0, r1=r1):
                e = r0.apply({"params": ctx[0][0]}, x_)
                return r1.apply({"params": ctx[0][1]}, jax.nn.silu(e))

            add(f"readout_{t}", readout_fn, (p[f"readout_{t}_0"], p[f"readout_{t}_1"]), x)
        else:
            add(f"readout_{t}", apply(EquivariantLinear(irreps_x, "0e", 1, backend)), p[f"readout_{t}"], x)
    pieces["_edges"] = int(batch.graph.num_edges)
    pieces["_nodes"] = int(batch.positions.shape[0])
    return pieces


def time_pieces(pieces: dict, rounds: int, only=None) -> dict[str, float]:
    """Best-of-``rounds`` ms per piece, pieces interleaved within each round (order reversed every other)."""
    unknown = sorted(set(only or ()) - set(pieces))
    if unknown:
        raise SystemExit(f"--only: no pieces {unknown}; pieces: {[n for n in pieces if not n.startswith('_')]}")
    names = [n for n in pieces if not n.startswith("_") and (not only or n in only)]
    for n in names:  # compile and warm
        fn, args = pieces[n]
        jax.block_until_ready(fn(*args))
    best = {n: float("inf") for n in names}
    for r in range(rounds):
        for n in names[:: 1 if r % 2 == 0 else -1]:
            fn, args = pieces[n]
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            best[n] = min(best[n], (time.perf_counter() - t0) * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=8, help="fcc cells per axis (4·repeats³ atoms)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", nargs="*", help="time only these pieces")
    ap.add_argument("--backend", default="reference", help="e3j backend of the convolutions (default: reference)")
    ap.add_argument("--json", help="also write the timings here")
    args = ap.parse_args()
    record = provenance("benchmarks/md_step_pieces.py")
    with e3j.use_backend(args.backend):  # read when the pieces are traced, inside time_pieces
        pieces = build_pieces(args.repeats)
        best = time_pieces(pieces, args.rounds, args.only)
    step = best.get("step")
    if args.json:
        record.update(
            backend=args.backend,
            nodes=int(pieces["_nodes"]),
            edges=int(pieces["_edges"]),
            rounds=args.rounds,
            best_ms=best,
            share_of_step={n: ms / step for n, ms in best.items() if step and n != "step"},
        )
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    print(f"cuni_mace, {pieces['_nodes']} nodes (padded), {pieces['_edges']} edges, float32, best of {args.rounds}")
    print(f"{'piece (fwd + bwd)':<28} {'ms':>8} {'of step':>8}")
    for n, ms in best.items():
        share = f"{ms / step:8.1%}" if step and n != "step" else ""
        print(f"{n:<28} {ms:8.2f} {share}")
    print(f"sum of pieces (without step) {sum(v for k, v in best.items() if k != 'step'):8.2f}")


if __name__ == "__main__":
    main()
