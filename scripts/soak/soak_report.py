"""The soak's result (scripts/soak/soak.py) as Markdown tables, as docs/bench/soak.md shows them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

KINDS = ("answered", "refused", "crashed", "hung_up", "failed")


def _table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _protocols(result: dict) -> str:
    """Outcomes by protocol and streaming."""
    cells: dict[tuple[str, bool], dict[str, int]] = defaultdict(dict)
    for protocol, streamed, kind, n in result["by_protocol"]:
        cells[(protocol, streamed)][kind] = n
    rows = [[p, "stream" if s else "whole", *(c.get(k, 0) for k in KINDS), sum(c.values())]
            for (p, s), c in sorted(cells.items())]
    return _table(["protocol", "mode", *KINDS, "total"], rows)


def _samples(result: dict) -> str:
    rows = []
    for label, s in result["samples"].items():
        for p in s["processes"]:
            rows.append([label, s["sent"], p["role"], p["pid"], p["fds"], p["threads"], p["rss_mib"], p["state"]])
    return _table(["when", "requests sent", "process", "pid", "fds", "threads", "RSS MiB", "state"], rows)


def _series(result: dict) -> str:
    s = result["series"]
    if not s:
        return "(no readings)"
    fds, threads, rss = ([x[k] for x in s] for k in ("fds", "threads", "rss_mib"))
    return _table(["readings", "fds first/min/max/last", "threads first/min/max/last", "RSS MiB first/min/max/last"],
                  [[len(s), f"{fds[0]}/{min(fds)}/{max(fds)}/{fds[-1]}",
                    f"{threads[0]}/{min(threads)}/{max(threads)}/{threads[-1]}",
                    f"{rss[0]}/{min(rss)}/{max(rss)}/{rss[-1]}"]])


def markdown(result: dict) -> str:
    out = [f"## {result['mode']} mode: {result['sent']} requests in {result['seconds']} s", ""]
    out.append(_table(["outcome", "requests"], [[k, result["outcomes"].get(k, 0)] for k in KINDS]))
    out += ["", _protocols(result), ""]
    if result["events"]:
        out += [_table(["event", "times"], sorted(result["events"].items())), ""]
    wakes = sorted(result["wakes_s"])
    if wakes:
        out += [f"First answer from a restarted runner: median {wakes[len(wakes) // 2]:.1f} s, "
                f"max {wakes[-1]:.1f} s over {len(wakes)} restarts.", ""]
    heads = ["model", "sent", "counted (read)", "ended a runner (unread)", "lost in a crash", "generations",
             "readings", "mismatches", "errors (read)", "cancelled (read)"]
    keys = ["sent", "counted_read", "ended_runner_unread", "lost_in_crash", "generations", "readings", "mismatches",
            "errors_read", "cancelled_read"]
    out += [_table(heads, [[m, *(t.get(k, "") for k in keys)] for m, t in result["counters"].items()]), ""]
    if result["router_answered"]:
        out += [f"Answered by the router itself (not forwarded): {result['router_answered']}", ""]
    out += [_samples(result), "", "The " + ("router" if result["mode"] == "router" else "server")
            + "'s own numbers at every reading:", "", _series(result), ""]
    zombies = {label: s["zombies"] for label, s in result["samples"].items()}
    loads = {label: s["loadavg"] for label, s in result["samples"].items()}
    out += [f"Zombies among its processes: {zombies}", f"Load average (1/5/15 min): before "
            f"{result['loadavg_before']}, {loads}, after {result['loadavg_after']}", ""]
    sd = result["shutdown"]
    out += [f"Shutdown (SIGTERM): exit code {sd['exit_code']} after {sd['stop_s']} s; of {sd['processes_seen']} "
            f"processes seen, left: {sd['left_over'] or 'none'}; port free: {sd['port_free']}; runner ports "
            f"still held: {sd['runner_ports_busy'] or 'none'}", ""]
    failures = result["failures"]
    out.append(f"Failures: {len(failures)}")
    out += [f"- {f}" for f in failures[:40]]
    if result["schedule"].get("stopped_early"):
        out.append(f"Stopped early (--max-seconds): {result['schedule']}")
    return "\n".join(out)
