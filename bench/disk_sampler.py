#!/usr/bin/env python3
"""Samples a block device's counters beside a training run, tagged with the step in progress.

Every INTERVAL seconds it appends one line to OUT: the time, the number of step lines the job's
--report file holds (the step in progress is that plus one) and the device's /sys/block/DEV/stat
counters. `summarize` turns the samples into per-step rates, utilisation and requests in flight,
so a step off its bound shows whether the disk was busy, and how deep its queue was.

  disk_sampler.py sample DIR REPORT OUT [INTERVAL]   (until killed; DIR: where the job's files are)
  disk_sampler.py summarize OUT                      (JSON: {step: {read_GBps, write_GBps, busy, in_flight}})
"""
import json
import os
import sys
import time


def device_of(path):
    """The whole block device holding `path` (a partition's parent), as named under /sys/block."""
    st = os.stat(path)
    link = os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    name = os.path.basename(link)
    if not os.path.exists(f"/sys/block/{name}"):  # a partition: its parent directory is the disk
        name = os.path.basename(os.path.dirname(link))
    return name


def step_lines(report):
    try:
        with open(report) as f:
            return sum(1 for line in f if '"ledger"' in line)
    except OSError:
        return 0


def sample(directory, report, out, interval):
    dev = device_of(directory)
    with open(out, "w") as o:
        o.write(json.dumps({"device": dev}) + "\n")
        while True:
            with open(f"/sys/block/{dev}/stat") as f:
                fields = [int(x) for x in f.read().split()]
            o.write(json.dumps([time.monotonic(), step_lines(report), fields]) + "\n")
            o.flush()
            time.sleep(interval)


def summarize(out):
    with open(out) as f:
        rows = [json.loads(line) for line in f][1:]
    steps = {}
    for (t0, n0, a), (t1, n1, b) in zip(rows, rows[1:]):
        s = steps.setdefault(n0 + 1, [0.0, 0, 0, 0, 0])  # seconds, sectors read, written, io ms, queue ms
        s[0] += t1 - t0
        s[1] += b[2] - a[2]
        s[2] += b[6] - a[6]
        s[3] += b[9] - a[9]
        s[4] += b[10] - a[10]
    return {k: {"seconds": v[0], "read_GBps": v[1] * 512 / v[0] / 1e9, "write_GBps": v[2] * 512 / v[0] / 1e9,
                "busy": v[3] / 1e3 / v[0], "in_flight": v[4] / 1e3 / v[0]}
            for k, v in sorted(steps.items()) if v[0] > 0}


if __name__ == "__main__":
    if sys.argv[1] == "sample":
        sample(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]) if len(sys.argv) > 5 else 0.25)
    else:
        print(json.dumps(summarize(sys.argv[2])))
