"""Runtime benchmark: committed steps per second, end-to-end latency and takeover time.

One service process (``python -m service serve``; ``--instances N``: N of them sharing the
partitions, as replicas would, one per core) beside a local single-node broker on this machine;
a scripted zero-latency model (whose cost does not grow with the conversation) and a
zero-latency async tool; turns of three tool cycles with checkpointing on, so every step
(invocation) is one command, one result and one committed state. The driver plays upstream and
downstream: it keys commands by session id as a Kafka producer with the default partitioner
would, and reads results ``read_committed``. The service runs with its shipped defaults, group
timings included. Prints a table and writes JSON (``--out``). A benchmark, not a test: it
reports, it does not assert targets.

Phases: saturation (closed loop), the same with the tool declared ``effect="once"`` (its start
committed before it runs, its result right after; ``--skip-once``), latency at ``--load`` of
saturation (open loop; ``--rate`` fixes the rate and skips both saturations), takeover after
``kill -9`` of the first instance (``--skip-takeover``; with one instance a second joins first,
with more the others take its partitions over). Each phase reports the CPU of the services, the
broker (when known) and the driver, so a figure can be read against how busy the machine was.

Broker: ``CAIRN_TEST_BOOTSTRAP`` names a running one (pass ``--broker-pid`` for its CPU);
otherwise one is started from the Maven jars for the run and stopped after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.settings import GroupSettings, RuntimeSettings  # noqa: E402
from tests.support.runtime_harness import Cluster, ServiceProcess  # noqa: E402

STEPS_PER_TURN = 7  # 3 tool cycles with checkpointing: 2 pauses per cycle, then end_turn
CLK_TCK = os.sysconf("SC_CLK_TCK")


def interpreter() -> dict[str, Any]:
    """The Python the service and the driver ran on. Its build moves the CPU figures: the
    service spent about 6 % more CPU per step on one without profile-guided and link-time
    optimisation (pyenv's default build) than on Debian's (see docs/runtime.md)."""
    maps = Path("/proc/self/maps")
    shared = "libpython" in maps.read_text() if maps.exists() else None
    return {
        "version": platform.python_version(),
        "executable": getattr(sys, "_base_executable", sys.executable),
        "libpython_shared": shared,
    }


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all processes, all cores)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@contextlib.contextmanager
def broker(properties: dict[str, str]) -> Iterator[tuple[str, int | None]]:
    external = os.environ.get("CAIRN_TEST_BOOTSTRAP")
    if external:
        yield external, None
        return
    sys.path.insert(0, str(REPO / "deploy" / "local-kafka"))
    kafka_local = importlib.import_module("kafka_local")
    base = Path(tempfile.mkdtemp(prefix="cairn-bench-kafka-"))
    config = kafka_local.BrokerConfig(
        data_dir=base,
        port=kafka_local.free_port(),
        controller_port=kafka_local.free_port(),
        die_with_parent=True,
        extra_properties=properties,
    )
    local = kafka_local.LocalBroker(config)
    started = local.start(timeout=180.0)
    try:
        yield config.bootstrap, started.pid
    finally:
        local.stop()
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class Session:
    sid: str
    partition: int
    step: int = 0
    turn: int = 0
    checkpoint: dict[str, Any] | None = None
    command_id: str = ""
    sent_at: float = 0.0
    sent_wall_ms: float = 0.0


@dataclass
class Window:
    started: float = 0.0
    results: int = 0
    latencies: list[float] = field(default_factory=list)
    before_produce: list[float] = field(default_factory=list)
    """Command sent -> its result appended to the service's transaction (result timestamp)."""
    after_produce: list[float] = field(default_factory=list)
    """Result appended -> visible to a read_committed reader (produce, commit, markers, fetch)."""
    errors: int = 0


class Driver:
    """Upstream and downstream in one: publishes commands, reads committed results."""

    def __init__(self, cluster: Cluster, prefix: str = "bench", agent: str = "bench") -> None:
        self.cluster = cluster
        self.prefix = prefix
        self.agent = agent
        self.sessions: dict[str, Session] = {}
        self.ready: deque[Session] = deque()
        self.window: Window | None = None
        self.closed_loop = False
        self.result_times: list[tuple[float, int, float]] = []
        self.counter = 0
        self._partitioner = DefaultPartitioner()
        self._all = list(range(cluster.partitions))
        self._commands = cluster.topics.commands

    async def start(self) -> None:
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.cluster.bootstrap, linger_ms=1, acks=1
        )
        await self.producer.start()
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.cluster.bootstrap,
            group_id=None,
            isolation_level="read_committed",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
        )
        await self.consumer.start()
        results = self.cluster.topics.results
        partitions = [TopicPartition(results, p) for p in range(self.cluster.partitions)]
        self.consumer.assign(partitions)
        await self.consumer.seek_to_end(*partitions)
        self.reader = asyncio.create_task(self.read())

    async def stop(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader
        await self.consumer.stop()
        await self.producer.stop()

    def add_sessions(self, count: int) -> None:
        for _ in range(count):
            index = len(self.sessions)
            sid = f"{self.prefix}-{index}"
            # Where an upstream producer keying by session id puts it (Kafka's default
            # partitioner), so results and events share the command's partition number.
            session = Session(sid, self._partitioner(sid.encode(), self._all, self._all))
            self.sessions[session.sid] = session
            self.ready.append(session)

    async def send(self, session: Session) -> None:
        self.counter += 1
        session.command_id = f"{session.sid}-{self.counter}"
        if session.step == 0:
            body: dict[str, Any] = {
                "type": "invoke",
                "schema_version": 1,
                "command_id": session.command_id,
                "session_id": session.sid,
                "agent": self.agent,
                "prompt": f"turn {session.turn}",
            }
        else:
            body = {
                "type": "resume",
                "schema_version": 1,
                "command_id": session.command_id,
                "session_id": session.sid,
                "resume": {"checkpointResume": {"checkpoint": session.checkpoint}},
            }
        session.sent_at = time.perf_counter()
        session.sent_wall_ms = time.time() * 1000
        await self.producer.send(
            self._commands,
            value=orjson.dumps(body),
            key=session.sid.encode(),
            partition=session.partition,
        )

    async def read(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100, max_records=5000)
            now = time.perf_counter()
            for records in batches.values():
                for record in records:
                    await self.on_result(orjson.loads(record.value), now, record.timestamp)

    async def on_result(self, result: dict[str, Any], now: float, appended_ms: int) -> None:
        session = self.sessions.get(result["session_id"])
        if session is None or result["command_id"] != session.command_id:
            return
        self.result_times.append((now, session.partition, session.sent_at))
        window = self.window
        if window is not None:
            window.results += 1
            window.latencies.append(now - session.sent_at)
            visible_ms = time.time() * 1000
            window.before_produce.append((appended_ms - session.sent_wall_ms) / 1000)
            window.after_produce.append((visible_ms - appended_ms) / 1000)
            if result["stop_reason"] not in ("checkpoint", "end_turn"):
                window.errors += 1
        if result["stop_reason"] == "checkpoint":
            session.checkpoint = result["checkpoint"]
            session.step += 1
        else:
            session.step = 0
            session.turn += 1
            session.checkpoint = None
        if self.closed_loop:
            await self.send(session)
        else:
            self.ready.append(session)

    async def run_closed(self, duration: float, warmup: float) -> Window:
        self.closed_loop = True
        while self.ready:
            await self.send(self.ready.popleft())
        await asyncio.sleep(warmup)
        self.window = Window(started=time.perf_counter())
        await asyncio.sleep(duration)
        window, self.window = self.window, None
        self.closed_loop = False
        return window

    async def run_open(self, rate: float, duration: float, warmup: float) -> Window:
        """Send at ``rate`` commands per second from sessions whose last step is answered."""
        started = time.perf_counter()
        sent = 0
        measuring_from = started + warmup
        while True:
            now = time.perf_counter()
            if self.window is None and now >= measuring_from:
                self.window = Window(started=now)
            if now - started >= warmup + duration:
                break
            due = int((now - started) * rate) - sent
            while due > 0 and self.ready:
                await self.send(self.ready.popleft())
                sent += 1
                due -= 1
            # Until the next send is due, in ticks of 2 to 50 ms: sends due meanwhile go out
            # together, and a slow rate costs the driver few wake-ups.
            next_due = started + (sent + 1) / rate
            await asyncio.sleep(min(max(0.002, next_due - time.perf_counter()), 0.05))
        window, self.window = self.window, None
        assert window is not None
        return window

    async def drain(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ready) < len(self.sessions) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def commit_stats(log: str) -> dict[str, float]:
    """The last periodic commit-stats line of a service log."""
    lines = [line for line in log.splitlines() if "commit stats" in line]
    if not lines:
        return {}
    found = re.findall(r"(\w+)=<([0-9.]+)>", lines[-1])
    return {key: float(value) for key, value in found}


def all_commit_stats(procs: list[ServiceProcess]) -> dict[str, float]:
    """The last commit stats of every instance as one: counts summed, averages weighted by
    commits, maxima the largest."""
    each = [stats for stats in (commit_stats(proc.text()) for proc in procs) if stats]
    if len(each) <= 1:
        return each[0] if each else {}
    commits = sum(stats.get("commits", 0.0) for stats in each) or 1.0
    merged: dict[str, float] = {}
    for key in each[0]:
        values = [stats.get(key, 0.0) for stats in each]
        if key in ("commits", "results", "results_per_s"):
            merged[key] = round(sum(values), 1)
        elif key.endswith("_max"):
            merged[key] = max(values)
        elif key == "window_s":
            merged[key] = values[0]
        else:
            weights = [stats.get("commits", 0.0) for stats in each]
            merged[key] = round(
                sum(v * w for v, w in zip(values, weights, strict=True)) / commits, 2
            )
    return merged


async def wait_ready(procs: list[ServiceProcess], partitions: int, timeout: float = 60.0) -> None:
    """Until every partition is ready on one of ``procs``, as their last assignments say."""
    deadline = time.monotonic() + timeout
    while True:
        ready: set[int] = set()
        for proc in procs:
            text = proc.text()
            start = text.rfind("partitions assigned")
            if start < 0:
                continue
            owned = assigned(proc)
            if text.count("partition ready", start) >= len(owned):
                ready |= owned
        if ready >= set(range(partitions)):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions ready: {sorted(ready)} of {partitions}")
        await asyncio.sleep(0.1)


def services_cpu(procs: list[ServiceProcess]) -> float:
    return sum(cpu_seconds(proc.pid) for proc in procs)


def assigned(proc: ServiceProcess) -> set[int]:
    lines = [line for line in proc.text().splitlines() if "partitions assigned" in line]
    match = re.search(r"partitions=<\[([0-9, ]*)\]>", lines[-1])
    assert match is not None
    return {int(p) for p in match.group(1).split(",") if p.strip()}


async def bench(
    args: argparse.Namespace, bootstrap: str, broker_pid: int | None, *, fresh_broker: bool
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="cairn-bench-"))
    cluster = Cluster(bootstrap, workdir, partitions=args.partitions)
    await cluster.create_topics()
    stores = workdir / "stores"
    stores.mkdir()
    env = {
        "TMPDIR": str(stores),
        "CAIRN_TEST_TOOL_LOG": "",
        "CAIRN_TEST_MODEL_LOG": "",
        "CAIRN_LOG_LEVEL": "INFO",
        "CAIRN_RUNTIME__MAX_IN_FLIGHT": str(args.max_in_flight),
    }
    # Unset knobs keep the service's defaults: the benchmark measures what ships (the test
    # harness shortens some group and drain timings; they are put back here).
    runtime = RuntimeSettings()
    group = GroupSettings()
    env.update(
        {
            "CAIRN_GROUP__SESSION_TIMEOUT_MS": str(group.session_timeout_ms),
            "CAIRN_GROUP__HEARTBEAT_INTERVAL_MS": str(group.heartbeat_interval_ms),
            "CAIRN_RUNTIME__REVOKE_GRACE_S": str(runtime.revoke_grace_s),
            "CAIRN_RUNTIME__TRANSACTION_TIMEOUT_MS": str(runtime.transaction_timeout_ms),
        }
    )
    tuned = {
        "commit_interval_ms": args.commit_interval_ms,
        "offsets_every_ms": args.offsets_every_ms,
        "fetch_max_records": args.fetch_max_records,
        "transaction_streams": args.transaction_streams,
        "transactions_version": args.transactions_version,
    }
    for name, value in tuned.items():
        if value is None:
            tuned[name] = getattr(runtime, name)
        else:
            env[f"CAIRN_RUNTIME__{name.upper()}"] = str(value)
    procs = [cluster.start(f"bench-{chr(ord('a') + n)}", **env) for n in range(args.instances)]
    first = procs[0]
    print(f"service pids {[proc.pid for proc in procs]}", file=sys.stderr, flush=True)
    second: ServiceProcess | None = None
    driver = Driver(cluster)
    report: dict[str, Any] = {
        "partitions": args.partitions,
        "instances": args.instances,
        "sessions": args.sessions,
        **tuned,
        "steps_per_turn": STEPS_PER_TURN,
        "cpus": os.cpu_count(),
        "interpreter": interpreter(),
    }
    try:
        await wait_ready(procs, args.partitions)
        if fresh_broker and args.broker_warmup > 0:
            # A broker just started spends its first minute compiling its hot paths (its CPU
            # then doubles per request); a serving broker is long past that. Sessions of their
            # own, so the measured ones start with short conversations as before.
            warm = Driver(cluster, prefix="warmup")
            await warm.start()
            warm.add_sessions(args.sessions)
            await warm.run_closed(args.broker_warmup, 0.0)
            await warm.drain()
            await warm.stop()
        report["broker_warmup_s"] = args.broker_warmup if fresh_broker else 0
        await driver.start()
        driver.add_sessions(args.sessions)

        if args.rate is None:
            # 1. saturation: every session always has its next step queued
            cpu_before = services_cpu(procs)
            broker_before = cpu_seconds(broker_pid) if broker_pid else None
            driver_before = time.process_time()
            machine_before = machine_busy_seconds()
            window = await driver.run_closed(args.duration, args.warmup)
            elapsed = time.perf_counter() - window.started
            cpu_used = services_cpu(procs) - cpu_before
            saturation = window.results / elapsed
            await driver.drain()
            stats = all_commit_stats(procs)
            report["saturation"] = {
                "steps_per_s": round(saturation, 1),
                "steps": window.results,
                "errors": window.errors,
                "latency_p50_ms": round(percentile(window.latencies, 0.5) * 1000, 2),
                "latency_p99_ms": round(percentile(window.latencies, 0.99) * 1000, 2),
                "service_cpu_ms_per_step": round(
                    cpu_used / max(window.results, 1) * 1000 * elapsed / (elapsed + args.warmup), 3
                ),
                "service_cpu_util": round(cpu_used / (elapsed + args.warmup), 2),
                "broker_cpu_util": round(
                    (cpu_seconds(broker_pid) - broker_before) / (elapsed + args.warmup), 2
                )
                if broker_pid and broker_before is not None
                else None,
                "driver_cpu_util": round(
                    (time.process_time() - driver_before) / (elapsed + args.warmup), 2
                ),
                "machine_cpu_util": round(
                    (machine_busy_seconds() - machine_before) / (elapsed + args.warmup), 2
                ),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "commit": stats,
            }

        if args.rate is None and not args.skip_once:
            # 1b. saturation again, on sessions of their own whose tool is a once tool
            once = Driver(cluster, prefix="once", agent="bench-once")
            await once.start()
            once.add_sessions(args.sessions)
            cpu_before = services_cpu(procs)
            window = await once.run_closed(args.duration, args.warmup)
            elapsed = time.perf_counter() - window.started
            cpu_used = services_cpu(procs) - cpu_before
            await once.drain()
            await once.stop()
            report["saturation_once"] = {
                "steps_per_s": round(window.results / elapsed, 1),
                "steps": window.results,
                "errors": window.errors,
                "service_cpu_ms_per_step": round(
                    cpu_used / max(window.results, 1) * 1000 * elapsed / (elapsed + args.warmup), 3
                ),
            }

        # 2. latency at half of saturation (open loop)
        rate = args.rate if args.rate is not None else saturation * args.load
        cpu_before = services_cpu(procs)
        machine_before = machine_busy_seconds()
        broker_before = cpu_seconds(broker_pid) if broker_pid else None
        driver_before = time.process_time()
        window = await driver.run_open(rate, args.duration, args.warmup)
        spent = args.duration + args.warmup
        usage = {
            "service_cpu_util": round((services_cpu(procs) - cpu_before) / spent, 2),
            "broker_cpu_util": round((cpu_seconds(broker_pid) - broker_before) / spent, 2)
            if broker_pid and broker_before is not None
            else None,
            "driver_cpu_util": round((time.process_time() - driver_before) / spent, 2),
            "machine_cpu_util": round((machine_busy_seconds() - machine_before) / spent, 2),
        }
        await driver.drain()
        report["half_load"] = {
            "target_rate": round(rate, 1),
            "steps_per_s": round(window.results / args.duration, 1),
            "latency_p50_ms": round(percentile(window.latencies, 0.5) * 1000, 2),
            "latency_p99_ms": round(percentile(window.latencies, 0.99) * 1000, 2),
            "latency_mean_ms": round(statistics.fmean(window.latencies) * 1000, 2)
            if window.latencies
            else None,
            # Split at the result's timestamp (set by the service when it appends the result to
            # its transaction; millisecond clock of this machine).
            "to_append_p50_ms": round(percentile(window.before_produce, 0.5) * 1000, 1),
            "append_to_visible_p50_ms": round(percentile(window.after_produce, 0.5) * 1000, 1),
            "to_append_p99_ms": round(percentile(window.before_produce, 0.99) * 1000, 1),
            "append_to_visible_p99_ms": round(percentile(window.after_produce, 0.99) * 1000, 1),
            **usage,
            "commit": all_commit_stats(procs),
        }
        report["turns_per_session"] = round(
            statistics.fmean(session.turn for session in driver.sessions.values()), 1
        )

        if args.skip_takeover:
            return report
        # 3. takeover: with one instance a second joins; the first is killed -9 under light
        # traffic, and the others take its partitions over
        if len(procs) == 1:
            second = cluster.start("bench-b", **env)
            await second.wait_ready()
            await first.wait_log("partitions assigned", 60, count=2)
        moved = assigned(first)
        traffic = asyncio.create_task(driver.run_open(args.takeover_rate, 30.0, 0.0))
        await asyncio.sleep(2.0)
        killed_at = time.perf_counter()
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        answered: dict[int, float] = {}
        seen = 0
        while time.monotonic() < deadline and len(answered) < len(moved):
            # A command sent after the kill to a moved partition can only be answered by the
            # instance that took the partition over.
            for t, p, sent in driver.result_times[seen:]:
                if sent > killed_at and p in moved:
                    answered[p] = min(answered.get(p, t), t)
            seen = len(driver.result_times)
            await asyncio.sleep(0.01)
        takeover = min(answered.values()) - killed_at if answered else None
        every = max(answered.values()) - killed_at if len(answered) == len(moved) else None
        traffic.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await traffic
        report["takeover"] = {
            "seconds": round(takeover, 2) if takeover is not None else None,
            "every_partition_seconds": round(every, 2) if every is not None else None,
            "moved_partitions": sorted(moved),
            "session_timeout_ms": int(env["CAIRN_GROUP__SESSION_TIMEOUT_MS"]),
            "heartbeat_interval_ms": int(env["CAIRN_GROUP__HEARTBEAT_INTERVAL_MS"]),
        }
    finally:
        for proc in (*procs, second):
            if proc is not None and proc.alive:
                proc.kill()
        with contextlib.suppress(Exception):
            await driver.stop()
        # A broker kept between runs (CAIRN_TEST_BOOTSTRAP) would otherwise carry every run's
        # partitions into the next.
        await cluster.delete_topics()
        # And the killed services' session stores (hundreds of MB a run; the logs stay).
        shutil.rmtree(stores, ignore_errors=True)
    return report


def _once_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    once = report.get("saturation_once")
    if once is None:
        return []
    ratio = once["steps_per_s"] / max(report["saturation"]["steps_per_s"], 0.1)
    return [
        ("committed steps/s, the tool a once tool", f"{once['steps_per_s']}", ""),
        ("  of the idempotent tool's", f"{ratio:.2f}x", ""),
        ("  service CPU per step (ms)", f"{once['service_cpu_ms_per_step']}", ""),
    ]


def table(report: dict[str, Any]) -> str:
    sat, half, take = report["saturation"], report["half_load"], report["takeover"]
    rows = [
        ("committed steps/s at saturation", f"{sat['steps_per_s']}", ">= 3000"),
        ("  service CPU per step (ms)", f"{sat['service_cpu_ms_per_step']}", ""),
        (
            "  service / broker / driver / whole machine CPU (cores)",
            f"{sat['service_cpu_util']} / {sat['broker_cpu_util']} / {sat['driver_cpu_util']}"
            f" / {sat['machine_cpu_util']}",
            "",
        ),
        ("  load average (1 min)", f"{sat['load_average_1m']}", ""),
        (
            "  commit ms avg (max)",
            f"{sat['commit'].get('commit_ms_avg')} ({sat['commit'].get('commit_ms_max')})",
            "",
        ),
        ("  outcomes per commit", f"{sat['commit'].get('outcomes_per_commit')}", ""),
        (
            "  event-loop lag ms avg (max)",
            f"{sat['commit'].get('loop_lag_ms_avg')} ({sat['commit'].get('loop_lag_ms_max')})",
            "",
        ),
        ("  state record bytes avg", f"{sat['commit'].get('state_bytes_avg')}", ""),
        *_once_rows(report),
        (f"e2e latency p50 at {half['target_rate']}/s (ms)", f"{half['latency_p50_ms']}", "< 20"),
        (f"e2e latency p99 at {half['target_rate']}/s (ms)", f"{half['latency_p99_ms']}", "< 100"),
        ("takeover after kill -9 (s)", f"{take['seconds']}", "< 10"),
        ("  every moved partition answering (s)", f"{take.get('every_partition_seconds')}", ""),
    ]
    python = report.get("interpreter")
    if python is not None:
        shared = {True: "libpython shared", False: "libpython static", None: "?"}
        build = shared[python["libpython_shared"]]
        rows.append(("python", f"{python['version']}, {build}", ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'metric'.ljust(width)}  {'value':>16}  target"]
    lines += [f"{name.ljust(width)}  {value:>16}  {target}" for name, value, target in rows]
    return "\n".join(lines)


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options; other benchmarks parse their own argv with it to run ``bench``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=600)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--instances", type=int, default=1, help="service processes sharing the partitions"
    )
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--load", type=float, default=0.5, help="fraction of saturation")
    parser.add_argument(
        "--broker-warmup",
        type=float,
        default=60.0,
        help="seconds of traffic before measuring, when the run starts its own broker",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="skip the saturation phase and measure latency at this many steps/s",
    )
    parser.add_argument("--skip-takeover", action="store_true", help="stop after the latency phase")
    parser.add_argument(
        "--skip-once", action="store_true", help="skip the saturation phase with a once tool"
    )
    parser.add_argument("--takeover-rate", type=float, default=100.0)
    parser.add_argument("--max-in-flight", type=int, default=1000)
    parser.add_argument("--commit-interval-ms", type=int, default=None)
    parser.add_argument("--offsets-every-ms", type=int, default=None)
    parser.add_argument("--transaction-streams", choices=("partition", "instance"), default=None)
    parser.add_argument("--fetch-max-records", type=int, default=None)
    parser.add_argument("--transactions-version", type=int, choices=(1, 2), default=None)
    parser.add_argument("--broker-pid", type=int, default=None, help="for CPU accounting")
    parser.add_argument(
        "--broker-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra property of the broker started for the run",
    )
    parser.add_argument("--out", default=str(REPO / "bench-results" / "runtime.json"))
    return parser


def main() -> int:
    args = arguments().parse_args()
    properties = dict(item.split("=", 1) for item in args.broker_property)
    with broker(properties) as (bootstrap, broker_pid):
        pid = broker_pid or args.broker_pid
        report = asyncio.run(bench(args, bootstrap, pid, fresh_broker=broker_pid is not None))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    if all(phase in report for phase in ("saturation", "half_load", "takeover")):
        print()
        print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
