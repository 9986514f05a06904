"""Tables and the plot of bench/scale/scale_bench.py: the markdown summary of a sweep's runs,
the plot of rendezvous time vs ranks, and both rewritten from a saved JSON (--from-json)."""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys

def median_or_nan(v):
    v = [x for x in v if x is not None and not math.isnan(x)]
    return statistics.median(v) if v else float("nan")


def cell(runs, key):
    v = [r[key] for r in runs if r["finished"]]
    if not v:
        return "DNF"
    if len(v) == 1:
        return f"{v[0]:.3g}"
    return f"{statistics.median(v):.3g} [{min(v):.3g}-{max(v):.3g}]"


def summarize(a, runs, elapsed, cmd, when, up):
    by = {}
    for r in runs:
        by.setdefault((r["ranks"], r["mode"]), []).append(r)
    lines = [f"### 96K-rank rendezvous through relays: {when}, {a.reps} repetition(s), "
             f"{elapsed:.0f} s", "",
             f"Command: `{cmd}`", "",
             f"Machine: {os.cpu_count()} CPUs; `uptime` at the end: `{up}`; net.ipv4.tcp_mem "
             f"during the sweep: {' '.join(a.tcp_mem_used)} pages.", "",
             "Each rank: connect, VALIDATE + PING, ADD init/ 1, NCCL scalable init (every 128th "
             "rank SETs a 128-byte id; every rank WAITs for all N/128 ids, then MULTI_GETs them), "
             f"BARRIER N. Ranks played by ceil(N/{a.gen_ranks}) generator processes started at one "
             f"instant; relays hold {a.relay_ranks} ranks each, one process and one loopback "
             "address each; the floor puts one echo server (no work, same bytes) where each relay "
             "is. Cells: median [min-max] over repetitions; wall = common start to the last "
             "rank's barrier release; CPU from /proc/PID/stat over the run; errors = connection "
             "errors + bad replies + failed ranks, summed over the repetitions.", "",
             "| N | mode | relays or echo servers, generators | wall (s) | rank p50 (s) "
             "| rank p99 (s) | server CPU (s) | CPU per relay (s) | server peak RSS (MiB) "
             "| errors | wall / floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in a.ranks:
        floor = median_or_nan([r["wall_s"] for r in by.get((n, "floor"), []) if r["finished"]])
        for mode in ("direct", "relays", "floor"):
            rs = by.get((n, mode))
            if not rs:
                continue
            errs = sum(r["conn_errors"] + r["bad_replies"] + r["ranks_failed"] for r in rs)
            dnf = sum(1 for r in rs if not r["finished"])
            srv = cell([dict(r, server_cpu_s=r["server_cpu_s"] or 0) for r in rs],
                       "server_cpu_s") if mode != "floor" else ""
            rss = median_or_nan([r.get("server_peak_rss_mib") for r in rs]) \
                if mode != "floor" else float("nan")
            rel = median_or_nan([median_or_nan(r["relay_cpu_s"]) for r in rs]) \
                if mode == "relays" else float("nan")
            ratio = median_or_nan([r["wall_s"] for r in rs if r["finished"]]) / floor \
                if mode != "floor" and floor == floor else float("nan")
            npr = rs[0]["relays"] or rs[0]["echo_servers"]
            lines.append(
                f"| {n} | {mode} | {npr if mode != 'direct' else '-'}, {rs[0]['generators']} "
                f"| {cell(rs, 'wall_s')} | {cell(rs, 'rank_p50_s')} | {cell(rs, 'rank_p99_s')} "
                f"| {srv} | {'' if math.isnan(rel) else f'{rel:.2f}'} "
                f"| {'' if math.isnan(rss) else f'{rss:.0f}'} "
                f"| {errs}{f' ({dnf} DNF)' if dnf else ''} "
                f"| {'' if math.isnan(ratio) else f'{ratio:.2f}'} |")
    return "\n".join(lines) + "\n"


def uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def plot(a, runs, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for mode, style, label in (("direct", "o-", "direct (one server)"),
                               ("relays", "s-", f"through relays ({a.relay_ranks} ranks each)"),
                               ("floor", "^--", "echo floor (same connections, no work)")):
        xs, ys, lo, hi = [], [], [], []
        for n in a.ranks:
            v = [r["wall_s"] for r in runs if r["mode"] == mode and r["ranks"] == n
                 and r["finished"]]
            if v:
                xs.append(n)
                ys.append(statistics.median(v))
                lo.append(ys[-1] - min(v))
                hi.append(max(v) - ys[-1])
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, label=label, capsize=3)
        for n in a.ranks:
            rs = [r for r in runs if r["mode"] == mode and r["ranks"] == n]
            dnf = sum(1 for r in rs if not r["finished"])
            if dnf:
                v = [r["wall_s"] for r in rs if r["finished"]]
                ax.annotate(f"{mode}: {dnf} of {len(rs)} runs not done in {a.timeout:.0f} s",
                            (n, statistics.median(v) if v else a.timeout),
                            textcoords="offset points", xytext=(-190, -4), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(a.ranks)
    ax.set_xticklabels([f"{n // 1024}K" for n in a.ranks])
    ax.set_xlabel("ranks (torch 2.x: handshake, ADD, NCCL scalable init, BARRIER)")
    ax.set_ylabel("rendezvous wall time (s), median [min-max]")
    ax.set_title(f"Rendezvous time vs ranks, one machine ({os.cpu_count()} CPUs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def report_again(path):
    with open(path) as f:
        j = json.load(f)
    a = argparse.Namespace(**j["options"])
    if not hasattr(a, "tcp_mem_used"):
        a.tcp_mem_used = ["?"]
    when = j.get("finished_at", "?")
    md = summarize(a, j["runs"], j["elapsed_s"], j["command"], when, j.get("uptime", "?"))
    stem = os.path.splitext(path)[0]
    with open(stem + ".md", "w") as f:
        f.write(md)
    plot(a, j["runs"], stem + ".png")
    print(md)
    return 0
