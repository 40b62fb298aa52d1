#!/usr/bin/env python3
"""What is alive at the allocator's peak, from a kiln memory snapshot.

    python3 tools/memory_peak.py SNAPSHOT.json [--top N]

Replays the snapshot's trace (kiln_memory_record_history, written by
kiln_memory_snapshot or `kiln bench checkpoint --snapshot`): for the moment
of the highest allocated total inside the trace it lists the live blocks
allocated during the trace, largest first, with the op that allocated them
and the allocation's sequence number, and the event just before the peak.
Blocks allocated before recording started are summed as "before trace".
"""
import json
import sys


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    with open(sys.argv[1]) as f:
        snap = json.load(f)
    trace = snap["device_traces"][0]
    live, total, peak, peak_at, peak_live = {}, 0, -1, None, {}
    freed_unknown = 0
    for ev in trace:
        a = ev["action"]
        if a == "alloc":
            live[ev["addr"]] = ev
            total += ev["size"]
            if total > peak:
                peak, peak_at, peak_live = total, ev, dict(live)
        elif a == "free_requested":
            if ev["addr"] in live:
                del live[ev["addr"]]
            else:
                freed_unknown += ev["size"]
            total -= ev["size"]
    mib = 1 / 1048576
    print(f"peak inside the trace: {peak * mib:.1f} MiB above the trace's start "
          f"(blocks allocated before it and freed during it: {freed_unknown * mib:.1f} MiB)")
    name = lambda e: (e.get("frames") or [{"name": "?"}])[0]["name"]
    print(f"reached at event {peak_at['seq']} ({name(peak_at)}, {peak_at['size'] * mib:.1f} MiB)")
    blocks = sorted(peak_live.values(), key=lambda e: -e["size"])
    by_op = {}
    for e in blocks:
        by_op[name(e)] = by_op.get(name(e), 0) + e["size"]
    print("live at the peak, by the allocating op:")
    for op, size in sorted(by_op.items(), key=lambda kv: -kv[1]):
        print(f"  {size * mib:9.1f} MiB  {op}")
    print(f"largest blocks (of {len(blocks)}):")
    for e in blocks[:top]:
        print(f"  {e['size'] * mib:9.1f} MiB  seq {e['seq']:6d}  {name(e)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
