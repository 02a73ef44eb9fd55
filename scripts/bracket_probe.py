#!/usr/bin/env python3
"""What a judge-side bracket of a candidate's run would cost (docs/integrity.md, Still open).

A judge process and a candidate process share two flags and an input and an output buffer in
GPU memory. For each run the candidate enqueues, ahead, on its own stream: wait until the go
flag reaches the run's number, copy the inputs in, (optionally) flush the L2 cache, start event,
the work, end event, copy the outputs out, write the done flag. The judge then records its own
event, writes fresh inputs and the go flag on its stream, waits on its stream for the done flag
and records a second event. The judge's interval holds the candidate's true GPU time of the
run, whatever the candidate's process claims; the probe reports, per workload:

  claim_us          the candidate's own event interval (what the harness measures today)
  alone_us          the same work with no judge context waiting beside it (interference check)
  bracket_us        the judge's interval
  overhead_us       bracket - claim: what a floor would have to allow for (median, p95, max)

Needs one GPU and torch; no network. Usage: bracket_probe.py [--runs N] [--out FILE.json]
"""
import argparse
import ctypes
import json
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

WORKLOADS = [
    # (name, rows of a row softmax over 1024 float32 columns, or sleep cycles)
    ("empty_kernel", "sleep", 0),
    ("softmax_256x1024", "softmax", 256),
    ("softmax_4096x1024", "softmax", 4096),  # the red-team task's size (16 MiB)
    ("softmax_65536x1024", "softmax", 65536),  # 256 MiB
    ("sleep_100k_cycles", "sleep", 100_000),
    ("sleep_2m_cycles", "sleep", 2_000_000),
]
GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ
L2_FLUSH_BYTES = 128 << 20


def _driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    fns = {}
    for name in ("cuStreamWaitValue32", "cuStreamWriteValue32"):
        fn = None
        for symbol in (name + "_v2", name):
            try:
                fn = getattr(cuda, symbol)
                break
            except AttributeError:
                continue
        if fn is None:
            raise RuntimeError(f"libcuda has no {name}")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fns[name] = fn
    return fns


def _check(code, what):
    if code != 0:
        raise RuntimeError(f"{what} failed with CUresult {code}")


def _work(kind, size, x):
    if kind == "softmax":
        return torch.softmax(x, dim=-1)
    torch.cuda._sleep(size)
    return x


def candidate(conn, flags, inputs, outputs, runs, flush):
    drv = _driver()
    torch.cuda.set_device(0)
    stream = torch.cuda.Stream()
    go, done = flags.data_ptr(), flags.data_ptr() + 4
    l2 = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    seq = 0
    while True:
        msg = conn.recv()
        if msg is None:
            return
        name, kind, size, bracketed = msg
        x = torch.empty(size if kind == "softmax" else 1, 1024, device="cuda")
        claims = []
        for _ in range(runs):
            seq += 1
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                if bracketed:
                    _check(drv["cuStreamWaitValue32"](stream.cuda_stream, go, seq, GEQ), "cuStreamWaitValue32")
                x.view(-1).copy_(inputs.view(-1)[: x.numel()])
                if flush:
                    l2.zero_()
                start.record(stream)
                y = _work(kind, size, x)
                end.record(stream)
                outputs.view(-1)[: y.numel()].copy_(y.view(-1))
                if bracketed:
                    _check(drv["cuStreamWriteValue32"](stream.cuda_stream, done, seq, 0), "cuStreamWriteValue32")
            conn.send(("enqueued", seq))
            end.synchronize()
            stream.synchronize()
            claims.append(start.elapsed_time(end) * 1000.0)
            conn.send(("claim", claims[-1]))


def _recv(conn, proc):
    if not conn.poll(60):
        raise RuntimeError(f"the candidate process said nothing for 60 s (exit code {proc.exitcode})")
    return conn.recv()


def quantiles(xs):
    xs = sorted(xs)
    return {"median": round(statistics.median(xs), 2), "p95": round(xs[int(0.95 * (len(xs) - 1))], 2),
            "min": round(xs[0], 2), "max": round(xs[-1], 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--out", default="")
    ap.add_argument("--no-flush", action="store_true")
    args = ap.parse_args()
    mp.set_start_method("spawn")
    torch.cuda.set_device(0)
    drv = _driver()
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    big = max(s for _, k, s in WORKLOADS if k == "softmax") * 1024
    inputs = torch.randn(big, device="cuda")
    outputs = torch.empty(big, device="cuda")
    parent, child = mp.Pipe()
    proc = mp.Process(target=candidate, args=(child, flags, inputs, outputs, args.runs, not args.no_flush))
    proc.start()
    stream = torch.cuda.Stream()
    go, done = flags.data_ptr(), flags.data_ptr() + 4
    fresh = torch.randn(big, device="cuda")
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": args.runs,
              "l2_flush": not args.no_flush, "date": time.strftime("%Y-%m-%d"), "workloads": {}}
    for name, kind, size in WORKLOADS:
        n = (size if kind == "softmax" else 1) * 1024
        # Alone: the candidate's claim with no judge context waiting beside it.
        parent.send((name, kind, size, False))
        alone = []
        for _ in range(args.runs):
            assert _recv(parent, proc)[0] == "enqueued"
            alone.append(_recv(parent, proc)[1])
        parent.send((name, kind, size, True))
        claims, brackets = [], []
        for _ in range(args.runs):
            tag, seq = _recv(parent, proc)
            assert tag == "enqueued"
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                a.record(stream)
                inputs[:n].copy_(fresh[:n])
                _check(drv["cuStreamWriteValue32"](stream.cuda_stream, go, seq, 0), "cuStreamWriteValue32")
                _check(drv["cuStreamWaitValue32"](stream.cuda_stream, done, seq, GEQ), "cuStreamWaitValue32")
                b.record(stream)
            b.synchronize()
            tag, claim = _recv(parent, proc)
            assert tag == "claim"
            claims.append(claim)
            brackets.append(a.elapsed_time(b) * 1000.0)
        over = [br - c for br, c in zip(brackets, claims)]
        row = {"alone_us": quantiles(alone), "claim_us": quantiles(claims), "bracket_us": quantiles(brackets),
               "overhead_us": quantiles(over)}
        report["workloads"][name] = row
        print(name, json.dumps(row), flush=True)
    parent.send(None)
    proc.join()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
