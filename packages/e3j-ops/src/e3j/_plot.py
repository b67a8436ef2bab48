"""PNG figures of ``python -m e3j bench`` results in the style of the paper's Fig. 1–2 (private).

One panel per (op, direction): throughput (GB/s) against batch or node count on a log2 axis, one
line per implementation, lmax and channel count, with the device copy measured in the same run and
the datasheet bandwidth (when known) as horizontal lines. Needs matplotlib (e3j's ``bench`` extra).
"""

from __future__ import annotations

__all__ = ["plot", "require_matplotlib"]


def require_matplotlib():
    """``matplotlib.pyplot`` on the Agg backend, or a ``RuntimeError`` naming the extra that brings it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        from e3j_core.dependencies import install_hint

        raise RuntimeError(f"plotting needs matplotlib: {install_hint('e3j', 'bench', 'matplotlib')}") from err
    return plt


def plot(result: dict, path: str) -> None:
    """Write ``result`` (the JSON of ``python -m e3j bench``) as a PNG figure at ``path``."""
    plt = require_matplotlib()
    rows = [r for r in result["rows"] if r["op"] != "convolution_memory" and "error" not in r]
    panels = list(dict.fromkeys((r["op"], r["direction"]) for r in rows))
    if not panels:
        raise ValueError("no successful measurement to plot")
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    configs = list(dict.fromkeys((r["lmax"], r["channels"]) for r in rows))
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "v", "D"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (op, direction) in zip(axes[0], panels, strict=True):
        mine = [r for r in rows if (r["op"], r["direction"]) == (op, direction)]
        # one colour per (lmax, channels), one line style and marker per implementation
        for key in dict.fromkeys((r["impl"], r["lmax"], r["channels"]) for r in mine):
            line = sorted((r["size"], r["GBps"]) for r in mine if (r["impl"], r["lmax"], r["channels"]) == key)
            k, c = impls.index(key[0]), configs.index(key[1:])
            ax.plot(
                *zip(*line, strict=True),
                color=f"C{c % 10}",
                linestyle=styles[k % len(styles)],
                marker=markers[k % len(markers)],
                label=f"{key[0]} l={key[1]} C={key[2]}",
            )
        ax.axhline(result["copy"]["GBps"], color="gray", linestyle="--", label="device copy (measured)")
        if result.get("datasheet_GBps"):
            ax.axhline(result["datasheet_GBps"], color="black", linestyle=":", label="datasheet bandwidth")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size" if op == "tensor_product" else "nodes")
        ax.set_ylabel("throughput (GB/s)")
        ax.set_title(f"{op.replace('_', ' ')} {'forward' if direction == 'fwd' else 'backward'}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"e3j bench on {result['device']['kind']} (jax {result['versions']['jax']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
