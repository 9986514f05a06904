"""bench/init results: the summary rows, the markdown tables and the plot
(used by init_bench.py; stdlib + matplotlib for the plot)."""
import statistics

# (name, from, to) over the marks of rank.py: the median over ranks of each phase
PHASES = [("rendezvous", "gate", "rdzv_end"), ("gloo_pg", "pg_start", "pg_end"),
          ("barrier", "barrier_start", "barrier_end"), ("all_reduce", None, None)]
WAY_TITLES = {
    "env": "torch default env:// (rank 0 hosts)",
    "torchstore": "torch's store started first",
    "agent": "agent-store recipe (tcpstore-server)",
    "url": "tcpstore://",
    "run": "python -m tcpstore.run",
}



def summarize(records, versions, worlds, ways):
    rows = []
    for v in versions:
        for w in worlds:
            for way in ways:
                timed = [r for r in records if r["version"] == v and r["world"] == w
                         and r["way"] == way and not r["count_run"]]
                ok = [r for r in timed if r["ok"]]
                cnt = [r for r in records if r["version"] == v and r["world"] == w
                       and r["way"] == way and r["count_run"] and r["ok"] and "requests" in r]
                row = {"version": v, "world": w, "way": way, "runs": len(timed), "ok": len(ok)}
                if ok:
                    row["p50_s"] = statistics.median(r["p50_s"] for r in ok)
                    row["max_s"] = statistics.median(r["max_s"] for r in ok)
                    row["init_p50_s"] = statistics.median(
                        statistics.median(r["init_only_s"]) for r in ok)
                    row["wall_s"] = statistics.median(r["wall_s"] for r in ok)
                    row["skew_s"] = statistics.median(r["release_skew_s"] for r in ok)
                    for name, _, _ in PHASES:
                        xs = [r["phases_p50_s"][name] for r in ok
                              if name in r.get("phases_p50_s", {})]
                        if len(xs) == len(ok):
                            row[f"phase_{name}_s"] = statistics.median(xs)
                    srv = [r["server_counters"]["total"] / w for r in ok
                           if r.get("server_counters")]
                    if srv and way in ("agent", "url"):
                        row["server_requests_per_rank"] = statistics.median(srv)
                if cnt:
                    row["requests_per_rank"] = cnt[-1]["requests_per_rank"]
                    row["polls_per_rank"] = cnt[-1]["polls_per_rank"]
                    row["counted_ranks"] = cnt[-1]["counted_ranks"]
                rows.append(row)
    return rows


def fmt(x, unit="s"):
    if x is None:
        return "n/a"
    return f"{x:.3f}" if unit == "s" else f"{x:.1f}"


def table(rows, meta):
    out = [f"bench/init: {meta['date']}, {meta['reps']} repetition(s), "
           f"{meta['elapsed_s']:.0f} s, load before: {meta['load_before']}", "",
           "| torch | W | way | rank p50 (s) | rank max (s) | init only p50 (s) | "
           "requests/rank | polls/rank | runs ok |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        req = r.get("requests_per_rank")
        note = ""
        if r.get("counted_ranks") is not None and r["way"] == "env":
            note = "*"
        out.append(f"| {r['version']} | {r['world']} | {WAY_TITLES[r['way']]} | "
                   f"{fmt(r.get('p50_s'))} | {fmt(r.get('max_s'))} | "
                   f"{fmt(r.get('init_p50_s'))} | "
                   f"{fmt(req, 'n')}{note} | {fmt(r.get('polls_per_rank'), 'n')}{note} | "
                   f"{r['ok']}/{r['runs']} |")
    out += ["", "Times: median over the runs of the per-rank p50 / max (each rank from its own "
            "release at the start gate to the end of its all_reduce; torch import excluded). "
            "\"init only\": to the return of init_process_group. Requests and polls per rank: "
            "one count run through the counting proxy (not timed). * env: ranks 1..W-1 only "
            "(rank 0 talks to the store in its own process, which no proxy can see)."]
    out += ["", "Where the time goes: the median over ranks of each phase (median over runs), "
            "in seconds. rendezvous: from the gate to the store handed to torch (connect; "
            "tcpstore://: also the join, which waits for every rank); gloo PG: the process "
            "group (gloo's full-mesh address exchange through the store and its W-1 TCP "
            "connections); barrier: the store-based barrier (1.13 only; 2.x runs none by "
            "default), mostly waiting for the slowest rank's gloo PG; all_reduce: the first "
            "collective.", "",
            "| torch | W | way | rendezvous | gloo PG | barrier | all_reduce |",
            "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["world"] < 32 or "p50_s" not in r:
            continue
        ph = [fmt(r.get(f"phase_{n}_s")) if f"phase_{n}_s" in r else "-"
              for n in ("rendezvous", "gloo_pg", "barrier", "all_reduce")]
        out.append(f"| {r['version']} | {r['world']} | {WAY_TITLES[r['way']]} | "
                   + " | ".join(ph) + " |")
    return "\n".join(out) + "\n"


def plot(rows, versions, worlds, ways, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot")
        return False
    fig, axes = plt.subplots(1, len(versions), figsize=(6 * len(versions), 4.2), sharey=True,
                             squeeze=False)
    for ax, v in zip(axes[0], versions):
        for way in ways:
            xs, p50, mx = [], [], []
            for w in worlds:
                r = next((r for r in rows if r["version"] == v and r["world"] == w
                          and r["way"] == way and "p50_s" in r), None)
                if r:
                    xs.append(w)
                    p50.append(r["p50_s"])
                    mx.append(r["max_s"])
            if xs:
                line, = ax.plot(xs, p50, marker="o", label=f"{WAY_TITLES[way]} (p50)")
                ax.plot(xs, mx, marker="x", linestyle=":", color=line.get_color())
        ax.set_title(f"torch {v}: init_process_group + all_reduce")
        ax.set_xlabel("ranks (W)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(worlds)
        ax.set_xticklabels([str(w) for w in worlds])
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("per-rank time (s); solid p50, dotted max")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True
