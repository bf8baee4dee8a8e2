"""A Bedrock agent served end to end: `cairn serve` hosts it from an agent file whose
``endpoint_url`` is a local server speaking ConverseStream's wire format, with fake AWS
credentials in the environment. Expired credentials end a command ``model_error``; the same
session then runs a checkpointed tool turn to its end."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support import bedrock_wire as bw
from tests.support.http_wire import WireServer
from tests.support.runtime_harness import (
    Client,
    Cluster,
    checkpoint_resume,
    invoke,
    services,
    unique,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

AGENTS_TOML = """
[[agents]]
name = "calc"
model = "{model}"
tools = ["service.demo.tools:calculator"]
checkpointing = true
[agents.provider]
type = "bedrock"
endpoint_url = "{url}"
region = "us-east-1"
retry = {{ max_retries = 1, initial_backoff_s = 0.05 }}
"""


@pytest.fixture
async def bedrock() -> AsyncIterator[WireServer]:
    server = WireServer()
    await server.start()
    yield server
    await server.stop()
    assert not server.unexpected, f"requests beyond the script: {server.unexpected}"


async def test_bedrock_agent_through_the_service(cluster: Cluster, bedrock: WireServer) -> None:
    agents_file = cluster.workdir / "agents.toml"
    agents_file.write_text(AGENTS_TOML.format(model=bw.MODEL, url=bedrock.url))
    bedrock.script(
        bw.expired_token(),
        bw.stream(bw.tool_events("tooluse_9", "calculator", {"expression": "2+3"})),
        bw.stream(bw.text_events("It is ", "5.")),
    )
    aws = {
        "AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKE0002",
        "AWS_SECRET_ACCESS_KEY": "fake-secret-for-the-service-test",
        "AWS_CONFIG_FILE": str(cluster.workdir / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(cluster.workdir / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
    }
    with services() as procs:
        proc = cluster.start(CAIRN_AGENTS=str(agents_file), **aws)
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            session = unique("s")
            failed = invoke(session, "What is 2+3?", agent="calc")
            await client.send(failed)
            result = await client.result(failed["command_id"], alive=proc)
            assert result["stop_reason"] == "error", result
            assert result["error"]["code"] == "model_error"
            assert "ExpiredTokenException" in result["error"]["message"]
            assert "the AWS credentials have expired" in result["error"]["message"]

            command = invoke(session, "Please use the calculator.", agent="calc")
            await client.send(command)
            result = await client.result(command["command_id"], alive=proc)
            assert result["stop_reason"] == "checkpoint", result
            assert result["checkpoint"]["position"] == "after_model"

            command = checkpoint_resume(session, result["checkpoint"])
            await client.send(command)
            result = await client.result(command["command_id"], alive=proc)
            assert result["checkpoint"]["position"] == "after_tools", result

            command = checkpoint_resume(session, result["checkpoint"])
            await client.send(command)
            result = await client.result(command["command_id"], alive=proc)
            assert result["stop_reason"] == "end_turn", result
            assert result["message"] == {"role": "assistant", "content": [{"text": "It is 5."}]}
        assert await proc.terminate() == 0, proc.text()[-3000:]

    assert len(bedrock.requests) == 3
    for seen in bedrock.requests:
        assert seen.headers["authorization"].startswith(
            "AWS4-HMAC-SHA256 Credential=AKIAFAKEFAKEFAKE0002/"
        )
    results = [
        block["toolResult"]
        for message in bedrock.requests[2].body["messages"]
        for block in message["content"]
        if "toolResult" in block
    ]
    assert results == [
        {"toolUseId": "tooluse_9", "status": "success", "content": [{"text": "2+3 = 5"}]}
    ]
    assert "fake-secret-for-the-service-test" not in proc.text()
    assert "Unclosed client session" not in proc.text()
