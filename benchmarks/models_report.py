"""Tables and plots of docs/models.md from finished run directories (their summary.json).

    .venv/bin/python benchmarks/models_report.py --sweep 0=runs/dm_dn_hp5 0.005=runs/dm_dn_dyn0.005 \
        --rate deepmimic:16=runs/ae_dm16 deepmimic:4=runs/ae_dm4 bandai:16=runs/ae_bandai16_b --out docs

``--sweep WEIGHT=RUN``: the dynamics-loss sweep (same model, one weight per run): MPJPE and the
plausibility metrics (acceleration error, jitter, foot skate) on validation and test, noisy input,
each relative to weight 0. ``--rate CORPUS:NUMBERS=RUN``: the rate-distortion table (model vs the
per-frame PCA with the same numbers per frame, clean input).
"""
import argparse
import json
from pathlib import Path

PLAUSIBILITY = ("accel", "jitter", "foot_skate")


def _results(run: str) -> dict:
    path = Path(run) / "summary.json"
    if not path.exists():
        raise SystemExit(f"{path}: missing (did the run finish?)")
    return json.loads(path.read_text())["results"]


def sweep(pairs, out: Path) -> list[str]:
    runs = sorted(((float(w), _results(r)) for w, r in pairs), key=lambda wr: wr[0])
    base = dict(runs[0][1]["validation"]["noisy"]["model"]), dict(runs[0][1]["test"]["noisy"]["model"])
    lines = ["| dynamics weight | split | MPJPE cm | accel m/s² | jitter m/s³ | foot skate cm/s |",
             "|---|---|---|---|---|---|"]
    for w, res in runs:
        for split, ref in zip(("validation", "test"), base, strict=True):
            m = res[split]["noisy"]["model"]
            rel = lambda k, m=m, ref=ref: f"{m[k]:.2f} ({100 * (m[k] / ref[k] - 1):+.0f}%)"
            lines.append(f"| {w:g} | {split} | {rel('mpjpe')} | {rel('accel')} | {rel('jitter')} | "
                         f"{rel('foot_skate')} |")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    for ax, k in zip(axes, ("mpjpe", *PLAUSIBILITY), strict=True):
        for split, marker in (("validation", "o"), ("test", "s")):
            ax.plot([w for w, _ in runs], [r[split]["noisy"]["model"][k] for _, r in runs], marker=marker,
                    label=split)
        ax.set_xscale("symlog", linthresh=1e-3)  # weight 0 sits on the axis
        ax.set(xlabel="dynamics weight", title=k)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "models_dynamics_sweep.png", dpi=110)
    plt.close(fig)
    return lines


def rate(pairs, out: Path) -> list[str]:
    rows = []
    for key, run in pairs:
        corpus, numbers = key.split(":")
        res = _results(run)
        for split in ("train", "validation", "test"):
            row = res[split]["clean"]
            rows.append((corpus, int(numbers), split, row["model"]["mpjpe"], row["pca"]["mpjpe"]))
    rows.sort()
    lines = ["| corpus | numbers/frame | split | model MPJPE cm | PCA MPJPE cm |", "|---|---|---|---|---|"]
    lines += [f"| {c} | {n} | {s} | {m:.2f} | {p:.2f} |" for c, n, s, m, p in rows]
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.8, 3.6))
    for i, corpus in enumerate(sorted({r[0] for r in rows})):
        pts = sorted((n, m, p) for c, n, s, m, p in rows if c == corpus and s == "test")
        ax.plot([n for n, _, _ in pts], [m for _, m, _ in pts], "o-", color=f"C{i}", label=f"{corpus} model")
        ax.plot([n for n, _, _ in pts], [p for _, _, p in pts], "x--", color=f"C{i}", label=f"{corpus} PCA")
    ax.set(xscale="log", yscale="log", xlabel="numbers per frame", ylabel="test MPJPE (cm)",
           title="rate-distortion (unseen clips)")
    ax.set_xticks([4, 8, 16], ["4", "8", "16"])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))  # 1, 10, not 10^0, 10^1
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out / "models_rate_distortion.png", dpi=110)
    plt.close(fig)
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", nargs="*", default=[], help="WEIGHT=RUN_DIR")
    parser.add_argument("--rate", nargs="*", default=[], help="CORPUS:NUMBERS=RUN_DIR")
    parser.add_argument("--out", default="docs/results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    split = lambda items: [item.split("=", 1) for item in items]
    if args.sweep:
        print("\n".join(sweep(split(args.sweep), out)))
    if args.rate:
        print("\n".join(rate(split(args.rate), out)))


if __name__ == "__main__":
    main()
