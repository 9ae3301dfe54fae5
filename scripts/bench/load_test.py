#!/usr/bin/env python3
"""Load test: sgl-engine (CPU, default admission bounds) at 2x and 5x its sustainable load.

1. Saturation: 16 clients send requests back to back for --warm seconds; the completed
   requests per second are the sustainable rate.
2. For each level (default 2 and 5): an open loop of Poisson arrivals at level x that rate for
   --duration seconds. Every request is /generate with a 64-token prompt of random ids and
   --max-new-tokens greedy tokens, with a 300 s client timeout.

Prints, per level: sent, accepted (200), shed (429: the waiting bound; 503: a request that
would not start, or did not, before the queue deadline; each with the time its answer took),
other failures, latency percentiles of the accepted requests, and the server's peak resident
memory (VmHWM is per process, so the peak of the level's own samples of VmRSS is shown too).
What a bounded server shows: shed answers (429 and 503) within milliseconds, accepted latency
bounded by the queue deadline (--queue-timeout-secs, 60 s by default) plus the service time,
memory flat. --binary runs another build (e.g. a copy of an older one) for a comparison on the
same machine.

    cargo build --release -p sgl-engine
    python3 scripts/bench/load_test.py --model "$(scripts/fetch-model.sh)" [--duration 60]
        [--rate R --binary OTHER_BUILD] [--levels 5 --duration 600 --rss-every 60]

--rss-every N adds the server's RSS over time (peak and last sample of each N-second window),
for the long run that shows memory stays bounded (10 minutes at 5x), with the machine's load
average at the end of each window.

--hog-procs N --hog-at S --hog-for D slows the engine down in the middle of each level: N
busy-looping processes run from S to S + D seconds into it, taking CPU from the engine as
other work on a shared machine does. What the admission should show then: the requests it
accepted before the slowdown that can no longer start in time are answered 503 before the
queue deadline, not at it ("503 at the deadline" stays near zero).
"""
import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class Server:
    def __init__(self, binary, model, port, extra):
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(os.path.join("/tmp", f"load_test_{port}.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "serve", "--model-path", model, "--port", str(port), "--device", "cpu"]
            + extra,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
                return
            except Exception:
                if self.proc.poll() is not None:
                    sys.exit(f"server exited; see {self.log.name}")
                time.sleep(0.5)
        sys.exit("server did not become healthy in 120 s")

    def info(self):
        with urllib.request.urlopen(self.url + "/get_server_info", timeout=10) as r:
            return json.load(r)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


class RssSampler(threading.Thread):
    """Samples the server's VmRSS every 0.25 s; keeps the peak and (time, KiB) samples."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.running = pid, 0, True
        self.start_time = time.perf_counter()
        self.samples = []

    def run(self):
        while self.running:
            kib = rss_kib(self.pid, "VmRSS")
            self.peak = max(self.peak, kib)
            self.samples.append((time.perf_counter() - self.start_time, kib, os.getloadavg()[0]))
            time.sleep(0.25)

    def windows(self, every):
        """(end second, peak KiB, last KiB, last 1-min load average) per window of `every`
        seconds."""
        out = {}
        for t, kib, load in self.samples:
            w = int(t // every)
            peak, _, _ = out.get(w, (0, 0, 0.0))
            out[w] = (max(peak, kib), kib, load)
        return [((w + 1) * every, *v) for w, v in sorted(out.items())]


class Hog(threading.Thread):
    """`procs` busy-looping processes from `at` to `at + seconds` after start()."""

    def __init__(self, procs, at, seconds):
        super().__init__(daemon=True)
        self.procs, self.at, self.seconds = procs, at, seconds
        self.stopped = threading.Event()
        self.children = []

    def run(self):
        if self.procs <= 0 or self.stopped.wait(self.at):
            return
        self.children = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.procs)
        ]
        self.stopped.wait(self.seconds)
        self.stop_children()

    def stop_children(self):
        for c in self.children:
            c.terminate()
        for c in self.children:
            c.wait(10)
        self.children = []

    def stop(self):
        self.stopped.set()
        self.join(15)
        self.stop_children()


def body(rng, max_new):
    return {
        "input_ids": [rng.randrange(1000, 40000) for _ in range(64)],
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
    }


async def one(session, url, payload):
    t = time.perf_counter()
    try:
        async with session.post(url + "/generate", json=payload) as r:
            await r.read()
            return r.status, time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - counted as a failure
        return f"error: {type(e).__name__}", time.perf_counter() - t


async def saturation(url, seconds, max_new, clients=16):
    rng = random.Random(1)
    done = 0
    end = time.perf_counter() + seconds
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def client():
            nonlocal done
            while time.perf_counter() < end:
                status, _ = await one(session, url, body(rng, max_new))
                done += status == 200

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return done / (time.perf_counter() - start)


async def open_loop(url, rate, seconds, max_new, seed):
    rng = random.Random(seed)
    tasks = []
    timeout = aiohttp.ClientTimeout(total=300)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            tasks.append(asyncio.create_task(one(session, url, body(rng, max_new))))
            await asyncio.sleep(rng.expovariate(rate))
        return await asyncio.gather(*tasks)


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=30123)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--warm", type=float, default=20)
    ap.add_argument("--levels", default="2,5")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--server-args", default="", help="extra engine flags, space separated")
    ap.add_argument(
        "--rss-every",
        type=float,
        default=0,
        help="also print the server's RSS over time: peak and last sample of each window of "
        "this many seconds (0: only the level's peak)",
    )
    ap.add_argument(
        "--rate",
        type=float,
        help="take this as the sustainable rate (req/s) instead of measuring it, so that "
        "two builds get the same offered load",
    )
    ap.add_argument("--hog-procs", type=int, default=0,
                    help="busy-looping processes that slow the engine down during each level")
    ap.add_argument("--hog-at", type=float, default=0,
                    help="seconds into each level when the hog processes start")
    ap.add_argument("--hog-for", type=float, default=0,
                    help="seconds the hog processes run")
    ap.add_argument(
        "--binary",
        default=os.path.join(ROOT, "target/release/sgl-engine"),
        help="the sgl-engine binary (to compare builds on the same machine)",
    )
    args = ap.parse_args()

    print("command: " + " ".join(sys.argv))
    print("load average (1, 5, 15 min) before: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    server = Server(args.binary, args.model, args.port, args.server_args.split())
    try:
        info = server.info()
        print(
            f"engine: max_running_requests {info['max_running_requests']}, "
            f"max_queued_requests {info['max_queued_requests']}, "
            f"max_queued_tokens {info['max_queued_tokens']}, "
            f"queue_timeout_secs {info['queue_timeout_secs']}"
        )
        print(
            f"workload: /generate, 64-token prompts, {args.max_new_tokens} greedy tokens each"
        )
        measured = asyncio.run(saturation(server.url, args.warm, args.max_new_tokens))
        print(f"sustainable: {measured:.2f} req/s (16 clients back to back, {args.warm:.0f} s)")
        rate = args.rate or measured
        if args.rate:
            print(f"levels are multiples of --rate {rate:.2f} req/s")
        if args.hog_procs > 0:
            print(f"slowdown: {args.hog_procs} busy-looping processes from {args.hog_at:.0f} s "
                  f"to {args.hog_at + args.hog_for:.0f} s into each level")
        deadline = float(info["queue_timeout_secs"] or "inf")
        print(
            "| load | sent | accepted | 429 | 429 answer p50 / p99 s | 503 (after 1 s / at the "
            "deadline) | 503 answer p50 / p99 s | other | accepted latency p50 / p90 / p99 s "
            "| peak RSS MiB (level) | VmHWM MiB |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for i, level in enumerate(float(x) for x in args.levels.split(",")):
            sampler = RssSampler(server.proc.pid)
            sampler.start()
            hog = Hog(args.hog_procs, args.hog_at, args.hog_for)
            hog.start()
            try:
                results = asyncio.run(
                    open_loop(server.url, rate * level, args.duration, args.max_new_tokens, 10 + i)
                )
            finally:
                hog.stop()
            sampler.running = False
            ok = [t for s, t in results if s == 200]
            full = [t for s, t in results if s == 429]
            late = [t for s, t in results if s == 503]
            other = len(results) - len(ok) - len(full) - len(late)
            print(
                f"| {level:g}x ({rate * level:.1f} req/s) | {len(results)} | {len(ok)} "
                f"| {len(full)} | {pct(full, 50):.3f} / {pct(full, 99):.3f} "
                f"| {len(late)} ({sum(1 for t in late if t >= 1.0)} / "
                f"{sum(1 for t in late if t >= deadline)}) "
                f"| {pct(late, 50):.3f} / {pct(late, 99):.3f} | {other} "
                f"| {pct(ok, 50):.1f} / {pct(ok, 90):.1f} / {pct(ok, 99):.1f} "
                f"| {sampler.peak / 1024:.0f} | {rss_kib(server.proc.pid, 'VmHWM') / 1024:.0f} |",
                flush=True,
            )
            early = [t for t in late if 1.0 <= t < deadline]
            if early:
                print(f"  503 after 1 s and before the deadline (refused while waiting): "
                      f"{len(early)}, answered after p50 {pct(early, 50):.1f} s, "
                      f"p90 {pct(early, 90):.1f} s, max {max(early):.1f} s")
            if other:
                print("  other answers:", sorted({str(s) for s, _ in results if s != 200 and s not in (429, 503)}))
            if args.rss_every > 0:
                print(f"  RSS over time at {level:g}x (the load ends at {args.duration:.0f} s; "
                      "later windows are the drain):")
                print("  | until s | peak RSS MiB | last RSS MiB | load average (1 min) |")
                print("  | --- | --- | --- | --- |")
                for end, peak, last, load in sampler.windows(args.rss_every):
                    print(f"  | {end:.0f} | {peak / 1024:.0f} | {last / 1024:.0f} | {load:.2f} |",
                          flush=True)
            print("  load average (1, 5, 15 min) after the level: "
                  + ", ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
