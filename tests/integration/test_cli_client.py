"""The ``cairn`` client commands drive the demo agent on a running service (real broker, real
processes) and print what a person needs: pauses, interrupts, answers, state."""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import sys
from collections.abc import AsyncIterator

import pytest

from tests.support.runtime_harness import REPO, Cluster, ServiceProcess, services, unique

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

DEMO = {"CAIRN_AGENTS": "service.demo:agents"}
README = (REPO / "README.md").read_text()


async def cli(
    cluster: Cluster, *args: str, timeout: float = 60.0, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "service",
        *args,
        cwd=REPO,
        env=cluster.env(**DEMO, **(env or {})),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except BaseException:
        # Timed out, or the test ended early (cancelled): never leave the client running.
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def expect(cluster: Cluster, *args: str, contains: tuple[str, ...], code: int = 0) -> str:
    rc, out, err = await cli(cluster, *args)
    assert rc == code, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    for fragment in contains:
        assert fragment in out + err, f"{fragment!r} missing from:\n{out}\n{err}"
    return out


@pytest.fixture
async def demo_service(cluster: Cluster) -> AsyncIterator[ServiceProcess]:
    with services() as procs:
        proc = cluster.start(**DEMO)
        procs.append(proc)
        await proc.wait_ready()
        yield proc


async def test_checkpoints_interrupt_and_answer_through_the_cli(
    cluster: Cluster, demo_service: ServiceProcess
) -> None:
    s = unique("s")
    prompt = "What is 17 * 23, and the weather in Lisbon?"
    out = await expect(
        cluster,
        *("invoke", "--session", s, "--checkpointing", "--wait", prompt),
        contains=(
            "sent     invoke",
            "stop_reason=checkpoint",
            "checkpoint: after_model (cycle 0)",
            'tool call calculator {"expression":"17 * 23"}',
            f"next: cairn resume --session {s} --wait",
        ),
    )
    assert "checkpoint: after_model (cycle 0, paused)" in out
    out = await expect(
        cluster,
        *("resume", "--session", s, "--wait"),
        contains=("checkpoint: after_tools (cycle 0)", "tool finished: calculator"),
    )
    await expect(
        cluster,
        *("resume", "--session", s, "--wait"),
        contains=("checkpoint: after_model (cycle 1)", "tool call request_approval"),
    )
    await expect(
        cluster,
        *("resume", "--session", s, "--wait"),
        contains=(
            "stop_reason=interrupt",
            "interrupt: approval",
            "id: v1:tool_call:",
            f"next: cairn resume --session {s} --answer true --wait",
        ),
    )
    await expect(
        cluster,
        *("session", "show", s),
        contains=("paused at: interrupt (answer to continue)", "approval id=v1:tool_call:"),
    )
    # A checkpoint resume while the interrupt waits is refused by the client before sending.
    await expect(
        cluster,
        *("resume", "--session", s),
        contains=("waits for answers to interrupts",),
        code=2,
    )
    await expect(
        cluster,
        *("resume", "--session", s, "--answer", "true", "--wait"),
        contains=("checkpoint: after_tools (cycle 1)", "tool finished: request_approval"),
    )
    await expect(
        cluster,
        *("resume", "--session", s, "--wait"),
        contains=(
            "stop_reason=end_turn",
            "17 * 23 = 391",
            "in Lisbon",
            "I shared it with the team.",
        ),
    )
    out = await expect(
        cluster,
        *("session", "show", s, "--results", "2"),
        contains=("agent=demo", "paused at: nothing (idle or finished)", "last 2 result(s):"),
    )
    assert out.count("result   session=") == 2
    await expect(
        cluster,
        *("resume", "--session", s),
        contains=("is not paused at a checkpoint",),
        code=2,
    )


async def test_a_refused_answer_and_an_error_result_are_shown(
    cluster: Cluster, demo_service: ServiceProcess
) -> None:
    s = unique("s")
    await expect(
        cluster,
        *("invoke", "--session", s, "--wait", "Compute 2 ** 8 for me in Oslo"),
        contains=("stop_reason=interrupt",),
    )
    await expect(
        cluster,
        *("resume", "--session", s, "--answer", '{"approved": false}', "--wait"),
        contains=("stop_reason=end_turn", "2 ** 8 = 256", "not approved"),
    )
    await expect(
        cluster,
        *("invoke", "--session", unique("s"), "--agent", "nobody", "--wait", "hi"),
        contains=("stop_reason=error", "error: unknown_agent"),
        code=1,
    )


async def test_watch_prints_results_as_they_are_committed(
    cluster: Cluster, demo_service: ServiceProcess
) -> None:
    s = unique("s")
    watcher = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "service", "watch", "--session", s),
        cwd=REPO,
        env=cluster.env(**DEMO),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert watcher.stdout is not None
    seen: list[str] = []
    try:

        async def read_until(fragment: str) -> None:
            while not any(fragment in line for line in seen):
                line = await watcher.stdout.readline()
                assert line, "watch exited:\n" + "".join(seen)
                seen.append(line.decode())

        await asyncio.wait_for(read_until("watching session"), 30)
        await expect(
            cluster,
            "invoke",
            "--session",
            s,
            "Run the slow job for 0.2 seconds",
            contains=("sent     invoke",),
        )
        await asyncio.wait_for(read_until("assistant: The job is over"), 60)
    finally:
        watcher.terminate()
        rc = await asyncio.wait_for(watcher.wait(), 30)
    assert rc == 143
    text = "".join(seen)
    assert "stop_reason=end_turn" in text
    assert "tool started: slow_job" in text
    assert "The job is over: job finished after 0.2s." in text


async def test_cancel_stops_a_running_slow_job(
    cluster: Cluster, demo_service: ServiceProcess
) -> None:
    s = unique("s")
    invoking = asyncio.create_task(
        cli(
            cluster,
            "invoke",
            "--session",
            s,
            "--command-id",
            f"{s}-job",
            "--wait",
            "--timeout",
            "60",
            "Run the slow job for 120 seconds",
            timeout=90,
        )
    )
    try:
        # The after_model boundary is committed before the tool runs: the job is under way then.
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            _, out, _ = await cli(cluster, "session", "show", s)
            if f"running: command {s}-job past after_model" in out:
                break
            assert asyncio.get_running_loop().time() < deadline, out
            assert not invoking.done(), invoking.result()
        rc, out, err = await cli(
            cluster,
            "cancel",
            "--session",
            s,
            "--message",
            "Stopped from the CLI",
            "--wait",
            "--command",
            f"{s}-job",
            "--timeout",
            "30",
        )
        assert rc == 0, out + err
        # The stopped job's result first, then the cancel's own, saying what it covered.
        results = [line for line in out.splitlines() if line.startswith("result ")]
        assert [f"command={s}-job" in line for line in results] == [True, False], out
        assert all("stop_reason=cancelled" in line for line in results)
        assert f"  cancel: stopped {s}-job" in out
        rc, out, err = await invoking
        assert rc == 0, out + err
        assert "stop_reason=cancelled" in out
        assert "Stopped from the CLI" in out
    finally:
        if not invoking.done():
            invoking.cancel()
            await asyncio.gather(invoking, return_exceptions=True)


async def test_an_error_result_leaves_the_pause_and_a_stray_answer_is_refused(
    cluster: Cluster, demo_service: ServiceProcess
) -> None:
    s = unique("s")
    await expect(
        cluster,
        *("invoke", "--session", s, "--wait", "--bootstrap-servers", cluster.bootstrap),
        "Compute 2 ** 8 for me in Oslo",
        contains=(
            "stop_reason=interrupt",
            f"next: cairn resume --session {s} --bootstrap-servers {cluster.bootstrap} "
            "--answer true --wait",
        ),
    )
    # Refused while the interrupt waits: the session's last result is now an error.
    await expect(
        cluster,
        *("invoke", "--session", s, "--wait", "hello"),
        contains=("stop_reason=error", "error: interrupt_pending"),
        code=1,
    )
    before = await expect(cluster, "session", "show", s, contains=("paused at: interrupt",))
    pending = re.findall(r"approval id=(\S+)", before)
    assert len(pending) == 1
    await expect(
        cluster,
        *("resume", "--session", s, "--answer", "bogus=true", "--wait"),
        contains=("names interrupt 'bogus', which is not pending", f"pending: {pending}"),
        code=2,
    )
    await expect(
        cluster,
        *("resume", "--session", s),
        contains=(f"waits for answers to interrupts {pending}",),
        code=2,
    )
    # Nothing was sent: the committed state and the last results are as they were.
    assert await expect(cluster, "session", "show", s, contains=()) == before
    await expect(
        cluster,
        *("resume", "--session", s, "--answer", "true", "--wait"),
        contains=("stop_reason=end_turn", "2 ** 8 = 256"),
    )


def _readme_commands(session: str) -> list[tuple[list[str], list[str]]]:
    """Every ``$ cairn ...`` of the README's console blocks for ``session``, with its output."""
    shown: list[tuple[list[str], list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ cairn "):
                shown.append((shlex.split(line[len("$ cairn ") :], comments=True), []))
            elif shown and line.strip():
                shown[-1][1].append(line)
    return [(args, out) for args, out in shown if session in args]


def _normalized(lines: list[str]) -> list[str]:
    """Output without what differs from run to run: command ids, partitions, offsets."""
    out = [re.sub(r"\bcli-[0-9a-f]{12}\b", "cli-ID", line) for line in lines]
    return [re.sub(r"\(partition \d+, offset \d+\)", "(partition P, offset O)", x) for x in out]


async def test_the_readme_tour_prints_what_the_readme_shows(
    cluster: Cluster, demo_service: ServiceProcess
) -> None:
    shown = _readme_commands("demo-1")
    assert [args[0] for args, _ in shown] == ["invoke", "resume", "resume", "resume", "resume"]
    # The README tells of one resume between its first two blocks instead of showing it.
    told = (["resume", "--session", "demo-1", "--wait"], None)
    tour = [*((args, out) for args, out in shown[:2]), told, *shown[2:]]
    for args, readme_out in tour:
        rc, out, err = await cli(cluster, *args)
        assert rc == 0, f"{args}: exit {rc}\n{out}\n{err}"
        if readme_out is not None:
            assert _normalized(out.splitlines()) == _normalized(readme_out), args


CHECKPOINT = '{"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}'


@pytest.mark.parametrize(
    "args",
    [
        ("invoke", "--session", "s-1", "hi"),
        ("invoke", "--session", "s-1", "--wait", "--timeout", "5", "hi"),
        ("resume", "--session", "s-1", "--checkpoint", CHECKPOINT),
        ("cancel", "--session", "s-1"),
        ("cancel", "--session", "s-1", "--wait", "--timeout", "5"),
        ("session", "delete", "--session", "s-1", "--no-wait"),
        ("session", "fork", "s-1", "--at", "1", "--as", "s-2", "--no-wait"),
    ],
)
async def test_a_command_for_a_missing_topic_is_refused_before_it_is_sent(
    cluster: Cluster, args: tuple[str, ...]
) -> None:
    """As ``session show`` and ``watch`` are: at once, one line, status 2 (the producer alone
    waited its own 30 s whatever ``--timeout`` said, then ended with a traceback)."""
    missing = {"CAIRN_TOPICS__COMMANDS": unique("gone"), "CAIRN_TOPICS__CONTROL": unique("gone")}
    topic = missing["CAIRN_TOPICS__CONTROL" if args[0] == "cancel" else "CAIRN_TOPICS__COMMANDS"]
    started = asyncio.get_running_loop().time()
    rc, out, err = await cli(cluster, *args, env=missing, timeout=50)
    assert rc == 2, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    assert "Traceback" not in err and "sent" not in out
    assert err.strip() == f"error: topics [{topic!r}] do not exist (run `cairn topics create`)"
    assert asyncio.get_running_loop().time() - started < 20


async def test_session_show_with_its_results_topic_missing_prints_nothing_else(
    cluster: Cluster, demo_service: ServiceProcess
) -> None:
    """The state is read from the sessions topic, the last results from the results topic: with
    the second missing, the command printed the state, then the error."""
    s = unique("s")
    await expect(
        cluster,
        *("invoke", "--session", s, "--wait", "What is 2 * 3?"),
        contains=("stop_reason=interrupt",),
    )
    gone = {"CAIRN_TOPICS__RESULTS": unique("gone")}
    rc, out, err = await cli(cluster, "session", "show", s, env=gone, timeout=50)
    assert rc == 2, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    assert out == ""
    topic = gone["CAIRN_TOPICS__RESULTS"]
    assert err.strip() == f"error: topics [{topic!r}] do not exist (run `cairn topics create`)"


async def test_the_missing_topics_hint_creates_them_on_the_cluster_the_command_named(
    cluster: Cluster,
) -> None:
    """With ``--bootstrap-servers`` the hint repeats it, and the hint, run as printed (the
    settings naming another broker), creates the topics there: the command then goes through."""
    topics = {"CAIRN_TOPICS__COMMANDS": unique("later"), "CAIRN_TOPICS__CONTROL": unique("later")}
    given = ("--bootstrap-servers", cluster.bootstrap)
    rc, _, err = await cli(cluster, "invoke", "--session", "s-1", *given, "hi", env=topics)
    assert rc == 2, err
    hint = f"cairn topics create --bootstrap-servers {cluster.bootstrap}"
    assert err.strip() == (
        f"error: topics [{topics['CAIRN_TOPICS__COMMANDS']!r}] do not exist (run `{hint}`)"
    )
    elsewhere = {**topics, "CAIRN_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    rc, out, err = await cli(cluster, *hint.split()[1:], env=elsewhere)
    assert rc == 0, err
    assert f"{topics['CAIRN_TOPICS__COMMANDS']}: created" in out
    rc, out, err = await cli(cluster, "invoke", "--session", "s-1", *given, "hi", env=elsewhere)
    assert rc == 0, err
    assert out.startswith("sent     invoke session=s-1")


@pytest.mark.parametrize(
    ("sent", "status", "said"),
    [(signal.SIGINT, 130, "cairn: interrupted"), (signal.SIGTERM, 143, "cairn: terminated")],
)
@pytest.mark.parametrize(
    ("args", "ready"),
    [
        (("watch",), "watching all sessions"),
        (("invoke", "--session", "s-1", "--wait", "hi"), "sent     invoke"),
    ],
)
async def test_a_signal_while_a_client_command_waits_ends_it_with_its_status(
    cluster: Cluster, args: tuple[str, ...], ready: str, sent: int, status: int, said: str
) -> None:
    """An interrupted wait is no success: status 130 for Ctrl-C and 143 for SIGTERM, as the
    shell reports a command those signals end, and one line saying so (it printed the start-up
    stop of ``serve`` and exited 0; a SIGTERM could leave ``watch`` hanging). No service runs,
    so the invoke waits for a result until the signal."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "service",
        *args,
        cwd=REPO,
        env=cluster.env(**DEMO, PYTHONUNBUFFERED="1"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert ready in line.decode()
        process.send_signal(sent)
        rc = await asyncio.wait_for(process.wait(), 30)
        err = (await process.stderr.read()).decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert rc == status, err
    assert err.strip() == said
