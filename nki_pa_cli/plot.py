"""PNG of the demo's MODELED per-engine busy times (matplotlib, the optional ``bench`` extra)."""
from __future__ import annotations

from pathlib import Path

from nki_sim.cost import ENGINES


def matplotlib_missing(instead: str) -> str | None:
    """None when matplotlib imports, else the message to show (checked before any long run);
    ``instead`` says how to run without a plot, e.g. "pass --no-png"."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ("matplotlib is not installed; install the plotting extra "
                f"(python -m pip install 'nki-paged-attention[bench]') or {instead}")
    return None


def plot_engine_bars(results, path: Path, title: str = "") -> None:
    """One panel per target: a bar per engine (per kernel when several), dashed line = modeled total.

    ``results``: objects with ``kernel``, ``target`` and ``report`` (an ``nki_sim.cost.CostReport``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = list(dict.fromkeys(r.target for r in results))
    kernels = list(dict.fromkeys(r.kernel for r in results))
    fig, axes = plt.subplots(1, len(targets), figsize=(5.5 * len(targets), 4.2), squeeze=False,
                             sharey=True)
    width = 0.8 / len(kernels)
    for ax, target in zip(axes[0], targets):
        for k, kernel in enumerate(kernels):
            (r,) = [r for r in results if r.target == target and r.kernel == kernel]
            xs = [i + (k - (len(kernels) - 1) / 2) * width for i in range(len(ENGINES))]
            bars = ax.bar(xs, [r.report.per_engine_us[e] for e in ENGINES], width, label=kernel)
            ax.axhline(r.report.modeled_us, ls="--", lw=1, color=bars.patches[0].get_facecolor(),
                       label=f"{kernel}: modeled total {r.report.modeled_us:.1f} us")
        ax.set_xticks(range(len(ENGINES)), ENGINES)
        ax.set_title(target)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("MODELED busy time per engine (us)")
    axes[0][0].set_ylim(0, 1.35 * max(r.report.modeled_us for r in results))   # room for the legend
    fig.suptitle("MODELED (nki_sim.cost, not measured)" + (f"\n{title}" if title else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
