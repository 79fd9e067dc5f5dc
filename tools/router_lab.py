#!/usr/bin/env python3
"""rserve replicas behind sglang-router on emulated machines (network namespaces).

Each worker runs in a network namespace of its own, joined to the router's namespace by a
veth link (optionally shaped with `tc netem`); the router and the client (`rbench serve`)
share one more namespace, which has only loopback and those links. Nothing can leave the
machine: no namespace has a route anywhere else (sglang-router looks for a tokenizer once
a worker names its model, and here it can only find the GGUF path rserve reports).

Phases (each optional, all by default):
  sweep    the same multi-tenant shared-prefix load through the router under each policy
           (cache_aware, round_robin), each policy with cold caches and a fresh router,
           the order alternated per repetition: prefix-cache hit rate from the workers'
           /metrics, TTFT, throughput, success rate, and how requests spread over workers;
  cost     what the router costs a request: one worker reached directly and through the
           router, alternated, at concurrency 1;
  kill     a worker killed (SIGKILL) mid-run: which requests failed, whether each was
           in flight at the kill, and whether every request sent after it succeeded;
  persist  a worker started with --kv-persist, restarted (SIGTERM, then started again on
           the same directory): its hit rate on the same load before and after, beside
           the same restart with an empty directory;
  rpc      (not by default) one model's layers on other machines through ggml's RPC:
           `rllama rpc-server` in worker 0's namespace (and worker 1's, with two or more
           workers), greedy text against the local ggml CPU device's, on one server and
           split over both, and `rbench -ngl 0,99 --rpc` over the links.

Needs root (namespaces), iproute2, sglang-router (pip) and the built rserve and rbench.
Writes DIR/results.json and DIR/summary.md; every process it starts is stopped and every
namespace it made is deleted on exit, whatever happened.

  tools/router_lab.py --out /tmp/lab [--workers 2] [--link 1gbit:0.2ms] [--phases sweep,kill]
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

NS_RE = re.compile(r"^rl(\d+)[rw]\d*$")
WORKER_PORT = 8000
# A dead worker out of rotation at its first failed attempt (the circuit breaker opens at
# once, and the router's retry of that request goes to another worker); by default it takes
# 10 failures or a 60-second health check, and cache_aware keeps choosing the dead worker
# for its tenants' prefixes until then, so retries land on it again (docs/replicas.md).
ROUTER_FAILOVER = ["--cb-failure-threshold", "1", "--health-check-interval-secs", "2",
                   "--health-failure-threshold", "1"]
ROUTER_PORT = 30000


def log(msg):
    print(f"router_lab: {msg}", file=sys.stderr, flush=True)


def sh(*cmd, check=True, capture=False, timeout=60):
    r = subprocess.run(
        cmd,
        check=False,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
    )
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: status {r.returncode}: {r.stderr.strip()}")
    return r.stdout if capture else r.returncode


def rate_bytes(rate):
    """`1gbit`, `10gbit`, `500mbit` as bytes per second."""
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"rate {rate!r}: want e.g. 1gbit, 500mbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def shape(ns, dev, link):
    """RATE:DELAY with netem (both on each end of a link); RATE alone with a token bucket,
    for kernels without sch_netem (this one's has no netem: the delay cannot be added)."""
    rate, _, delay = link.partition(":")
    if delay:
        r = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem",
                            "delay", delay, "rate", rate], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(
                f"netem on {dev}: {r.stderr.strip()} (this kernel has no sch_netem: give "
                f"--link {rate} to shape the rate alone with a token bucket)")
        return
    burst = max(int(rate_bytes(rate) / 250), 64 * 1024)
    sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
       "burst", str(burst), "latency", "10ms")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def remove_stale_namespaces():
    """Namespaces a killed earlier run left behind (its pid is in their names)."""
    out = sh("ip", "netns", "list", capture=True, check=False) or ""
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = NS_RE.match(name)
        if m and not pid_alive(int(m.group(1))):
            log(f"removing namespace {name} left by a run that is gone")
            kill_namespace(name)


def kill_namespace(ns):
    pids = (sh("ip", "netns", "pids", ns, capture=True, check=False) or "").split()
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    sh("ip", "netns", "del", ns, check=False)


class Lab:
    def __init__(self, a):
        self.a = a
        self.tag = f"rl{os.getpid()}"
        self.router_ns = f"{self.tag}r"
        self.worker_ns = [f"{self.tag}w{i}" for i in range(a.workers)]
        self.namespaces = []
        self.procs = {}  # name -> Popen
        self.logs = []
        self.out = a.out
        self.persist_dirs = {}
        self.tmp = tempfile.mkdtemp(prefix="router_lab.")

    # ---- network ----
    def worker_ip(self, i):
        return f"10.231.{i}.2"

    def worker_url(self, i):
        return f"http://{self.worker_ip(i)}:{WORKER_PORT}"

    def up(self):
        for ns in [self.router_ns] + self.worker_ns:
            sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for i, ns in enumerate(self.worker_ns):
            a, b = f"{self.tag}a{i}", f"{self.tag}b{i}"
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            sh("ip", "link", "set", a, "netns", self.router_ns)
            sh("ip", "link", "set", b, "netns", ns)
            sh("ip", "-n", self.router_ns, "addr", "add", f"10.231.{i}.1/30", "dev", a)
            sh("ip", "-n", ns, "addr", "add", f"{self.worker_ip(i)}/30", "dev", b)
            sh("ip", "-n", self.router_ns, "link", "set", a, "up")
            sh("ip", "-n", ns, "link", "set", b, "up")
            if self.a.link != "none":
                for n, dev in ((self.router_ns, a), (ns, b)):
                    shape(n, dev, self.a.link)
        # The links' round trip as shaped (a veth pair alone is a few tens of microseconds).
        self.rtt_ms = None
        if shutil.which("ping"):
            out = sh("ip", "netns", "exec", self.router_ns, "ping", "-q", "-c", "50", "-i",
                     "0.01", self.worker_ip(0), capture=True, check=False) or ""
            m = re.search(r"= [0-9.]+/([0-9.]+)/", out)
            self.rtt_ms = float(m.group(1)) if m else None
        # No namespace has a default route: nothing here can reach beyond these links.
        for ns in [self.router_ns] + self.worker_ns:
            routes = sh("ip", "-n", ns, "route", "show", "default", capture=True)
            if routes.strip():
                raise RuntimeError(f"namespace {ns} has a default route: {routes}")

    def down(self):
        for name in list(self.procs):
            self.stop(name, sig=signal.SIGKILL)
        for ns in self.namespaces:
            kill_namespace(ns)
        self.namespaces = []
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- processes ----
    def spawn(self, name, ns, cmd):
        logf = open(os.path.join(self.out, f"{name}.log"), "a")
        logf.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(cmd)}\n")
        logf.flush()
        p = subprocess.Popen(["ip", "netns", "exec", ns] + cmd, stdout=logf,
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return p

    def stop(self, name, sig=signal.SIGTERM, wait=60):
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)

    def curl(self, method, url, timeout=10):
        """(status, body) of a request made from the router's namespace."""
        out = sh("ip", "netns", "exec", self.router_ns, "curl", "-s", "-m", str(timeout),
                 "-X", method, "-w", "\n%{http_code}", url,
                 capture=True, check=False, timeout=timeout + 5)
        body, _, code = (out or "").rpartition("\n")
        return int(code or 0), body

    def wait_until(self, what, ok, timeout):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if ok():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}")

    def start_worker(self, i, persist_dir=None, kv_blocks=None):
        a = self.a
        cmd = [a.rserve, "-m", a.model, "--host", self.worker_ip(i), "--port", str(WORKER_PORT),
               "-t", str(a.threads), "--no-pin", "-c", str(a.ctx),
               "--parallel", str(a.parallel), "--kv-blocks", str(kv_blocks or a.kv_blocks)]
        if persist_dir:
            cmd += ["--kv-persist", persist_dir]
        self.spawn(f"worker{i}", self.worker_ns[i], cmd)
        self.wait_until(f"worker {i}",
                        lambda: self.curl("GET", self.worker_url(i) + "/health")[0] == 200, 120)

    def start_router(self, policy, workers):
        urls = [self.worker_url(i) for i in workers]
        cmd = [sys.executable, "-m", f"{self.a.router}_router.launch_router", "--worker-urls", *urls,
               "--policy", policy, "--host", "127.0.0.1", "--port", str(ROUTER_PORT),
               "--log-level", "warn" if self.a.router == "sglang" else "warning"] + ROUTER_FAILOVER
        p = self.spawn("router", self.router_ns, cmd)

        def ready():
            if p.poll() is not None:
                raise RuntimeError(f"the router exited with status {p.returncode} (router.log)")
            code, body = self.curl("GET", f"http://127.0.0.1:{ROUTER_PORT}/v1/models")
            return code == 200 and self.model_id in body
        self.wait_until(f"the router ({policy})", ready, 60)
        for i in workers:
            self.wait_router_healthy(i)

    def wait_router_healthy(self, i):
        """A worker restarted under a running router gets no requests until the router's
        health checks pass again (two in a row, every 2 s): wait for that, or the next run
        measures a worker the router still routes around."""
        url = self.worker_url(i)

        def healthy():
            code, body = self.curl("GET", f"http://127.0.0.1:{ROUTER_PORT}/workers")
            if code == 404:
                # A router without the listing: wait out its health checks instead.
                time.sleep(3 * 2)
                return True
            try:
                ws = json.loads(body).get("workers", [])
            except ValueError:
                return False
            return any(w.get("url") == url and w.get("is_healthy") for w in ws)
        self.wait_until(f"the router to see worker {i} healthy", healthy, 60)

    # ---- measurements ----
    def metrics(self, i):
        code, body = self.curl("GET", self.worker_url(i) + "/metrics")
        if code != 200:
            return None
        m = {}
        for line in body.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            k, v = line.rsplit(" ", 1)
            try:
                m[k] = float(v)
            except ValueError:
                pass
        return m

    def flush(self, i):
        code, body = self.curl("POST", self.worker_url(i) + "/flush_cache")
        if code != 200:
            raise RuntimeError(f"worker {i} /flush_cache: {code} {body}")

    def rbench(self, url, dataset, n, conc, out_len, name, background=False):
        res = os.path.join(self.tmp, f"{name}.jsonl")
        cmd = [self.a.rbench, "serve", "--url", url, "--model", self.model_id,
               "--dataset", dataset, "--num-prompts", str(n), "--concurrency", str(conc),
               "--output-len", str(out_len), "--ignore-eos", "--tokenizer-model", self.a.model,
               "--warmup", "0", "--cooldown", "0", "--seed", str(self.a.seed),
               "--result-file", res, "--save-detailed", "--timeout", "300"]
        p = self.spawn(f"rbench-{name}", self.router_ns, cmd)
        if background:
            return p, res
        return self.finish_rbench(p, res, name)

    def finish_rbench(self, p, res, name):
        p.wait(timeout=1800)
        self.procs.pop(f"rbench-{name}", None)
        # Status 3: some request failed (the kill phase expects that).
        if p.returncode not in (0, 3):
            raise RuntimeError(f"rbench {name}: status {p.returncode} (see rbench-{name}.log)")
        with open(res) as f:
            return json.loads(f.readlines()[-1])

    def hit_delta(self, before, after):
        per = []
        for i in range(len(before)):
            q = after[i]["rserve_prefix_cache_queries_total"] - before[i]["rserve_prefix_cache_queries_total"]
            h = after[i]["rserve_prefix_cache_hits_total"] - before[i]["rserve_prefix_cache_hits_total"]
            r = after[i]["rserve_requests_received_total"] - before[i]["rserve_requests_received_total"]
            per.append({"worker": i, "requests": int(r), "prompt_tokens_looked_up": int(q),
                        "hit_tokens": int(h), "hit_rate": h / q if q else 0.0})
        q = sum(p["prompt_tokens_looked_up"] for p in per)
        h = sum(p["hit_tokens"] for p in per)
        return (h / q if q else 0.0), per

    # ---- phases ----
    def sweep(self):
        a = self.a
        runs = []
        for rep in range(a.reps):
            order = a.policies if rep % 2 == 0 else list(reversed(a.policies))
            for policy in order:
                for i in range(a.workers):
                    self.flush(i)
                self.start_router(policy, range(a.workers))
                before = [self.metrics(i) for i in range(a.workers)]
                r = self.rbench(f"http://127.0.0.1:{ROUTER_PORT}", a.dataset, a.num_prompts,
                                a.concurrency, a.output_len, f"sweep-{policy}-{rep}")
                after = [self.metrics(i) for i in range(a.workers)]
                self.stop("router")
                rate, per = self.hit_delta(before, after)
                row = {"policy": policy, "rep": rep, "hit_rate": rate, "per_worker": per,
                       "completed": r["completed"], "failed": r["failed"],
                       "success_rate": r["success_rate"],
                       "median_ttft_ms": r["median_ttft_ms"], "p99_ttft_ms": r["p99_ttft_ms"],
                       "median_e2el_ms": r["median_e2el_ms"],
                       "output_throughput": r["output_throughput"],
                       "request_throughput": r["request_throughput"]}
                log(f"sweep {policy} rep {rep}: hit rate {rate:.3f}, TTFT p50 "
                    f"{r['median_ttft_ms']:.0f} ms, {r['completed']}/{r['completed'] + r['failed']} ok")
                runs.append(row)
        summary = {}
        for policy in a.policies:
            rows = [r for r in runs if r["policy"] == policy]
            summary[policy] = {k: statistics.median(r[k] for r in rows) for k in
                               ("hit_rate", "median_ttft_ms", "p99_ttft_ms", "median_e2el_ms",
                                "output_throughput", "success_rate")}
        return {"runs": runs, "median": summary}

    def cost(self):
        a = self.a
        rows = []
        self.start_router("round_robin", [0])
        for rep in range(a.reps * 2):
            for via in (["direct", "router"] if rep % 2 == 0 else ["router", "direct"]):
                url = self.worker_url(0) if via == "direct" else f"http://127.0.0.1:{ROUTER_PORT}"
                self.flush(0)
                r = self.rbench(url, "fixed:32/8", a.cost_prompts, 1, 8, f"cost-{via}-{rep}")
                rows.append({"via": via, "rep": rep, "mean_ttft_ms": r["mean_ttft_ms"],
                             "mean_e2el_ms": r["mean_e2el_ms"], "failed": r["failed"]})
        self.stop("router")
        med = {v: {k: statistics.median(r[k] for r in rows if r["via"] == v)
                   for k in ("mean_ttft_ms", "mean_e2el_ms")} for v in ("direct", "router")}
        return {"runs": rows, "median": med,
                "router_ttft_ms": med["router"]["mean_ttft_ms"] - med["direct"]["mean_ttft_ms"],
                "router_e2el_ms": med["router"]["mean_e2el_ms"] - med["direct"]["mean_e2el_ms"]}

    def kill(self):
        a = self.a
        victim = a.workers - 1
        for i in range(a.workers):
            self.flush(i)
        self.start_router("cache_aware", range(a.workers))
        p, res = self.rbench(f"http://127.0.0.1:{ROUTER_PORT}", a.dataset, a.kill_prompts,
                             a.concurrency, a.kill_output_len, "kill", background=True)
        # Kill once the victim is busy: requests running on it.
        t0 = time.time()
        while time.time() - t0 < 120 and p.poll() is None:
            m = self.metrics(victim)
            if (m and m.get("rserve_requests_running", 0) >= 1
                    and m.get("rserve_requests_received_total", 0) >= a.kill_after_requests):
                break
            time.sleep(0.2)
        # The victim's own count just before the kill; requests sent between this sample
        # and the kill may have reached it too, and are counted from the client's side.
        t_sample = time.time()
        m = self.metrics(victim) or {}
        # Received and not yet ended: in preparation, queued, waiting or running.
        ended = sum(v for k, v in m.items() if k.startswith("rserve_requests_total{"))
        inflight = int(m.get("rserve_requests_received_total", 0) - ended)
        t_kill = time.time()
        os.killpg(self.procs[f"worker{victim}"].pid, signal.SIGKILL)
        self.procs.pop(f"worker{victim}").wait(timeout=30)
        log(f"kill: worker {victim} killed with {inflight} request(s) in flight")
        r = self.finish_rbench(p, res, "kill")
        self.stop("router")
        sent = [r["start_unix"] + off for off in r["send_offsets"]]
        done = [s + lat for s, lat in zip(sent, r["latencies"])]
        errors = r["errors"]
        failed = [i for i, e in enumerate(errors) if e]
        failed_after = [i for i in failed if sent[i] >= t_kill]
        # Client side: sent before the kill and not answered by then.
        unfinished = [i for i in range(len(sent)) if sent[i] < t_kill and (errors[i] or done[i] > t_kill)]
        out = {"victim": victim, "inflight_at_kill": inflight,
               "sent_between_sample_and_kill": sum(1 for x in sent if t_sample <= x < t_kill),
               "requests": len(sent), "sent_after_kill": sum(1 for x in sent if x >= t_kill),
               "unfinished_at_kill": len(unfinished),
               "failed": len(failed), "failed_unfinished_at_kill": len(set(failed) & set(unfinished)),
               "failed_sent_after_kill": len(failed_after),
               "error_examples": [errors[i] for i in failed[:3]],
               "completed": r["completed"]}
        log(f"kill: {len(failed)} failed ({len(failed_after)} of them sent after the kill); "
            f"{out['sent_after_kill']} sent after the kill")
        # The victim comes back for the phases after this one.
        self.start_worker(victim, self.persist_dirs.get(victim))
        return out

    def persist(self):
        a = self.a
        victim = a.workers - 1
        rows = {}
        # The victim with room for what it reloads and for new sequences beside it: in a
        # cache that the reloaded blocks fill, the first new sequences evict them (the
        # least recently used) before their tenants come back.
        kv = 2 * a.kv_blocks
        for mode in ("persist", "empty"):
            d = os.path.join(self.tmp, f"kv-{mode}")
            os.makedirs(d, exist_ok=True)
            self.stop(f"worker{victim}")
            self.start_worker(victim, d, kv)
            for i in range(a.workers):
                self.flush(i)
            self.start_router("cache_aware", range(a.workers))
            # Warm: the load once, so the victim caches its tenants' prefixes.
            self.rbench(f"http://127.0.0.1:{ROUTER_PORT}", a.dataset, a.persist_prompts,
                        a.concurrency, a.output_len, f"persist-{mode}-warm")
            # The same load again on warm caches: the hit rate a restart should keep.
            before = self.metrics(victim)
            self.rbench(f"http://127.0.0.1:{ROUTER_PORT}", a.dataset, a.persist_prompts,
                        a.concurrency, a.output_len, f"persist-{mode}-warm2")
            warm_rate, _ = self.hit_delta([before], [self.metrics(victim)])
            # Restart the victim: on the same directory, or (the control) on an empty one.
            self.stop(f"worker{victim}")
            if mode == "empty":
                shutil.rmtree(d)
                os.makedirs(d)
            self.start_worker(victim, d, kv)
            self.wait_router_healthy(victim)
            before = self.metrics(victim)
            self.rbench(f"http://127.0.0.1:{ROUTER_PORT}", a.dataset, a.persist_prompts,
                        a.concurrency, a.output_len, f"persist-{mode}-after")
            after_rate, _ = self.hit_delta([before], [self.metrics(victim)])
            self.stop("router")
            files = sum(len(fs) for _, _, fs in os.walk(d))
            rows[mode] = {"hit_rate_warm": warm_rate, "hit_rate_after_restart": after_rate,
                          "files": files}
            log(f"persist ({mode} dir): victim hit rate warm {warm_rate:.3f}, "
                f"after restart {after_rate:.3f}")
        self.stop(f"worker{victim}")
        self.start_worker(victim)
        return rows


    def rpc(self):
        """One model's layers on other machines: `rllama rpc-server` (ggml's CPU device) in
        worker 0's namespace, and with two or more workers a second in worker 1's, the
        client in the router's, over the (shaped) links: all layers on the first server,
        then split over both (`--rpc A,B`, by their free memory as llama.cpp splits)."""
        a = self.a
        rllama = os.path.join(os.path.dirname(a.rbench), "rllama")
        n_srv = min(2, len(self.worker_ns))
        eps = [f"{self.worker_ip(i)}:50052" for i in range(n_srv)]
        for i in range(n_srv):
            self.spawn(f"rpc-server{i}", self.worker_ns[i],
                       [rllama, "rpc-server", "--host", self.worker_ip(i), "-p", "50052",
                        "-t", str(a.rpc_threads)])
            self.wait_until(f"rpc-server {i}", lambda i=i: sh(
                "ip", "netns", "exec", self.router_ns, "bash", "-c",
                f"exec 3<>/dev/tcp/{self.worker_ip(i)}/50052", check=False) == 0, 60)
        ep = eps[0]
        split = ",".join(eps)

        def run(extra):
            out = sh("ip", "netns", "exec", self.router_ns, rllama, "run", "-m", a.model,
                     "-t", str(a.rpc_threads), "-n", "32", "--json",
                     "-p", "The three primary colors are", "-ngl", "99", *extra,
                     capture=True, timeout=900)
            return json.loads(out)["text"]
        remote = run(["--rpc", ep])
        local = run(["--device", "CPU"])
        split_text = run(["--rpc", split]) if n_srv > 1 else None
        # Our CPU path, ggml's CPU device here, ggml's CPU device over there through the
        # link, and the layers split over two such devices: the last three differ only by
        # the network.
        configs = [["-ngl", "0"], ["-ngl", "99", "--device", "CPU"], ["-ngl", "99", "--rpc", ep]]
        if n_srv > 1:
            configs.append(["-ngl", "99", "--rpc", split])
        rows = []
        for extra in configs:
            out = sh("ip", "netns", "exec", self.router_ns, a.rbench, "-m", a.model, "-t",
                     str(a.rpc_threads), *extra, "-p", str(a.rpc_pp), "-n", str(a.rpc_tg),
                     "-r", str(a.reps + 2), "-o", "jsonl", capture=True, timeout=1800)
            for line in out.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    rows.append({k: r.get(k) for k in ("n_gpu_layers", "backends", "n_prompt",
                                                       "n_gen", "avg_ts", "stddev_ts")})
        for i in range(n_srv):
            self.stop(f"rpc-server{i}")
        log(f"rpc: greedy text {'equal' if remote == local else 'DIFFERS'}"
            + ("" if split_text is None else
               f", split {'equal' if split_text == local else 'DIFFERS'}") + f"; rows {rows}")
        return {"endpoint": ep, "endpoints": eps, "link": a.link, "greedy_equal": remote == local,
                "split_equal": None if split_text is None else split_text == local,
                "remote_text": remote, "local_text": local, "split_text": split_text,
                "bench": rows}


def summary_md(res, a):
    lines = [f"# {a.router}-router in front of {a.workers} rserve workers ({a.model})", "",
             f"Link: {a.link} (on both ends of each veth: netem for RATE:DELAY, a token bucket for RATE), "
             f"ping RTT {res.get('link_rtt_ms')} ms. Load: `{a.dataset}`, "
             f"{a.num_prompts} requests, concurrency {a.concurrency}, output {a.output_len} tokens; "
             f"workers `-t {a.threads} --parallel {a.parallel} --kv-blocks {a.kv_blocks} -c {a.ctx}`.", ""]
    if "sweep" in res:
        lines += ["| policy | prefix-cache hit rate | TTFT p50 ms | TTFT p99 ms | output tok/s | success |",
                  "|---|---|---|---|---|---|"]
        for p, m in res["sweep"]["median"].items():
            lines.append(f"| {p} | {m['hit_rate']:.3f} | {m['median_ttft_ms']:.0f} | "
                         f"{m['p99_ttft_ms']:.0f} | {m['output_throughput']:.1f} | {m['success_rate']:.3f} |")
        lines.append("")
        lines.append(f"Medians of {a.reps} repetition(s), policy order alternated.")
        lines.append("")
    if "cost" in res:
        c = res["cost"]
        lines.append(f"Router cost per request (concurrency 1, median of runs): TTFT "
                     f"{c['router_ttft_ms']:+.2f} ms, end-to-end {c['router_e2el_ms']:+.2f} ms "
                     f"(direct {c['median']['direct']['mean_e2el_ms']:.1f} ms).")
        lines.append("")
    if "kill" in res:
        k = res["kill"]
        lines.append(f"Worker kill: {k['inflight_at_kill']} request(s) in flight on the victim "
                     f"({k['unfinished_at_kill']} unanswered over all workers); {k['failed']} of "
                     f"{k['requests']} failed, {k['failed_unfinished_at_kill']} of them in flight "
                     f"at the kill and {k['failed_sent_after_kill']} sent after it; "
                     f"{k['sent_after_kill']} requests were sent after the kill.")
        lines.append("")
    if "persist" in res:
        for mode, r in res["persist"].items():
            lines.append(f"Restart with {'the same' if mode == 'persist' else 'an empty'} "
                         f"--kv-persist directory: victim hit rate {r['hit_rate_warm']:.3f} warm, "
                         f"{r['hit_rate_after_restart']:.3f} after the restart.")
        lines.append("")
    if "rpc" in res:
        r = res["rpc"]
        lines.append(f"ggml RPC (`rllama rpc-server` at {r['endpoint']}, link {r['link']}): greedy "
                     f"32 tokens {'equal to' if r['greedy_equal'] else 'DIFFERENT from'} the local "
                     f"ggml CPU device's.")
        if r.get("split_equal") is not None:
            lines.append("")
            lines.append(f"Split over {' and '.join(r['endpoints'])} (`--rpc` both, layers by free "
                         f"memory): greedy 32 tokens {'equal to' if r['split_equal'] else 'DIFFERENT from'} "
                         f"the local ggml CPU device's.")
        lines.append("")
        lines.append("| backend | ngl | test | t/s | stddev |")
        lines.append("|---|---|---|---|---|")
        for b in r["bench"]:
            test = f"pp{b['n_prompt']}" if b["n_prompt"] else f"tg{b['n_gen']}"
            lines.append(f"| {b['backends']} | {b['n_gpu_layers']} | {test} | {b['avg_ts']:.1f} | "
                         f"{b['stddev_ts']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rserve", default=os.environ.get("RSERVE_BIN", "target/release/rserve"))
    ap.add_argument("--rbench", default="target/release/rbench")
    ap.add_argument("--link", default="none", help="RATE:DELAY for netem on each link end "
                    "(e.g. 1gbit:0.2ms, 10gbit:0.05ms), RATE alone for a token bucket where "
                    "the kernel has no netem, or none")
    ap.add_argument("--dataset", default="shared-prefix:256:8")
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--kv-blocks", type=int, default=112)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--router", choices=["sglang", "vllm"], default="sglang",
                    help="sglang-router, or vllm-router (its fork, same launcher flags)")
    ap.add_argument("--policies", default="cache_aware,round_robin")
    ap.add_argument("--phases", default="sweep,cost,kill,persist")
    ap.add_argument("--cost-prompts", type=int, default=16)
    ap.add_argument("--kill-prompts", type=int, default=48)
    ap.add_argument("--rpc-threads", type=int, default=1)
    ap.add_argument("--rpc-pp", type=int, default=64)
    ap.add_argument("--rpc-tg", type=int, default=16)
    ap.add_argument("--kill-output-len", type=int, default=48)
    ap.add_argument("--kill-after-requests", type=int, default=6,
                    help="kill the victim once it has received this many requests and runs one")
    ap.add_argument("--persist-prompts", type=int, default=16,
                    help="requests per persist run: few per tenant, so the restart's cold "
                    "misses show")
    a = ap.parse_args()
    a.policies = a.policies.split(",")
    phases = a.phases.split(",")
    for p in phases:
        if p not in ("sweep", "cost", "kill", "persist", "rpc"):
            ap.error(f"unknown phase {p!r}")
    if os.geteuid() != 0:
        sys.exit("router_lab: needs root (it makes network namespaces)")
    for tool in ("ip", "tc", "curl"):
        if not shutil.which(tool):
            sys.exit(f"router_lab: {tool} is not installed")
    try:
        __import__(f"{a.router}_router")
    except ImportError:
        sys.exit(f"router_lab: {a.router}-router is not installed (pip install "
                 f"{'sglang-router==0.3.2' if a.router == 'sglang' else 'vllm-router'})")
    for b in (a.rserve, a.rbench):
        if not os.access(b, os.X_OK):
            sys.exit(f"router_lab: {b} is not an executable (build with cargo build --release)")
    a.rserve, a.rbench = os.path.abspath(a.rserve), os.path.abspath(a.rbench)
    os.makedirs(a.out, exist_ok=True)
    if not os.path.isfile(a.model):
        # Fetched (or found in the cache) here: the namespaces cannot reach a registry.
        rllama = os.path.join(os.path.dirname(a.rbench), "rllama")
        sh(rllama, "fetch", a.model, timeout=1800)
    remove_stale_namespaces()
    lab = Lab(a)

    def on_signal(sig, _):
        raise KeyboardInterrupt(f"signal {sig}")
    signal.signal(signal.SIGTERM, on_signal)
    res = {"settings": vars(a)}
    status = 0
    try:
        lab.up()
        for i in range(a.workers):
            lab.start_worker(i)
        code, body = lab.curl("GET", lab.worker_url(0) + "/v1/models")
        lab.model_id = json.loads(body)["data"][0]["id"]
        res["link_rtt_ms"] = lab.rtt_ms
        for p in phases:
            res[p] = getattr(lab, p)()
    except (Exception, KeyboardInterrupt) as e:
        log(f"failed: {e}")
        res["error"] = str(e)
        status = 1
    finally:
        lab.down()
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = summary_md(res, a)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return status


if __name__ == "__main__":
    sys.exit(main())
