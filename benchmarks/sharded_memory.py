"""Per-device temporary memory of ``e3j.convolution_sharded``: edge operands in the caller's order
against device blocks (``edge_layout="blocks"``), compiled for host devices (nothing is run).

    python benchmarks/sharded_memory.py [--devices 4] [--nodes 4000] [--edges 200000] [--channels 32] [--json F]

XLA's ``memory_analysis()`` of the compiled value and of value and gradient, per device, on an
Explicit and an Auto mesh axis, beside the size of the whole ``s``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=4000)
    parser.add_argument("--edges", type=int, default=200_000)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--json", help="write the rows here, with the command, date and host")
    args = parser.parse_args(argv)
    # before JAX starts: the host platform's device count
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import e3j
    from e3j._bench import provenance

    record = provenance("benchmarks/sharded_memory.py", argv if argv is not None else sys.argv[1:])
    conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
    n, e, c, d = args.nodes, args.edges, args.channels, args.devices
    rng = np.random.default_rng(0)
    pg = e3j.partition_graph(rng.integers(0, n, e), rng.integers(0, n, e), n, d)
    rows = []
    for kind in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((d,), ("d",), axis_types=(kind,), devices=jax.devices()[:d])
        sharded = NamedSharding(mesh, P("d"))
        x = jax.ShapeDtypeStruct((n, conv.coo.dim_x, c), jnp.float32, sharding=sharded)
        for layout, num in (("caller", e), ("blocks", d * pg.edge_capacity)):
            y = jax.ShapeDtypeStruct((num, conv.coo.dim_y), jnp.float32, sharding=sharded)
            s = jax.ShapeDtypeStruct((num, conv.num_paths, c), jnp.float32, sharding=sharded)

            def f(x, y, s, layout=layout, mesh=mesh):
                return e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d", edge_layout=layout, backend="reference")

            grad = jax.grad(lambda *a: jnp.sum(f(*a)), argnums=(0, 1, 2))
            row = {"axis": kind.name, "edge_layout": layout, "s_MiB": round(e * conv.num_paths * c * 4 / 2**20, 1)}
            for name, fn in (("value", f), ("value_and_gradient", grad)):
                temp = jax.jit(fn).lower(x, y, s).compile().memory_analysis().temp_size_in_bytes
                row[f"{name}_temp_MiB_per_device"] = round(temp / 2**20, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        record.update(devices=d, nodes=n, edges=e, channels=c, jax=jax.__version__, rows=rows)
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
