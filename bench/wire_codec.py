"""Wire codec benchmark: decode a typical invoke, encode a 20 KB agent_result.

Reports messages per second, the median of several runs, beside bare orjson for scale. Prints a
table and one JSON object (also written to ``bench-results/wire_codec.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from service.agent.types import AgentResult, Checkpoint
from service.wire.codec import decode_command, decode_result, encode_result
from service.wire.results import result_record

INVOKE = orjson.dumps(
    {
        "type": "invoke",
        "schema_version": 1,
        "command_id": "7d0c2a5e-2f4b-4a51-9a1e-5b7f3c2d9e10",
        "session_id": "support-4711",
        "agent": "support",
        "prompt": "Where is order 8812? If it is late, please refund the shipping fee.",
        "checkpointing": True,
        "limits": {"max_cycles": 8, "max_tokens": 20000, "deadline_s": 120.0},
        "invocation_state": {"customer_id": 77, "locale": "de-DE"},
        "metadata": {"tenant": "acme", "request_id": "req-2b1c", "trace": "00-4bf92f35-01"},
    }
)


def _big_result(target_bytes: int = 20_000) -> AgentResult:
    """An after_model pause whose assistant message and state make the record ~20 KB."""
    paragraph = "The order left the warehouse on Monday and is delayed by the carrier. " * 4
    content: list[dict[str, Any]] = [{"text": paragraph}]
    tool_uses = 0
    while len(orjson.dumps(content)) < target_bytes - 2_500:
        tool_uses += 1
        content.append(
            {
                "toolUse": {
                    "toolUseId": f"tooluse_{tool_uses:03d}",
                    "name": "lookup_order",
                    "input": {"order_id": str(8800 + tool_uses), "fields": ["status", "eta"]},
                }
            }
        )
        content.append({"text": paragraph[: 120 + tool_uses % 40]})
    usage = {"inputTokens": 4120, "outputTokens": 570, "totalTokens": 4690}
    invocation = {"cycles": 1, "usage": usage, "model_ms": 812.5, "duration_ms": 815.0, "tools": {}}
    return AgentResult(
        stop_reason="checkpoint",
        message={"role": "assistant", "content": content},
        checkpoint=Checkpoint(position="after_model", cycle_index=0),
        metrics={"invocation": invocation, "turn": {**invocation, "invocations": 1}},
        state={"customer_tier": "gold", "history": [{"order": str(i)} for i in range(40)]},
    )


def _rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``fn`` over roughly ``seconds`` of wall time."""
    batch = 1
    while True:
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return batch / elapsed
        batch *= 2 if elapsed < seconds / 4 else 1
        if elapsed >= seconds / 4:
            batch = max(batch, int(batch * seconds / max(elapsed, 1e-9)))


def measure(runs: int, seconds: float) -> dict[str, Any]:
    result = _big_result()
    record = result_record(result, session_id="support-4711", command_id="cmd-0001")
    encoded = encode_result(record)
    body = orjson.loads(INVOKE)
    cases: dict[str, Callable[[], object]] = {
        "invoke decode (decode_command)": lambda: decode_command(INVOKE, key=b"support-4711"),
        "invoke decode, orjson.loads only": lambda: orjson.loads(INVOKE),
        "20KB result encode (result_record + encode_result)": lambda: encode_result(
            result_record(result, session_id="support-4711", command_id="cmd-0001")
        ),
        "20KB result encode (encode_result of a built record)": lambda: encode_result(record),
        "20KB result encode, orjson.dumps only": lambda: orjson.dumps(result.to_dict()),
        "20KB result decode (decode_result)": lambda: decode_result(encoded),
    }
    assert decode_command(INVOKE).command_id == body["command_id"]
    figures = {}
    for name, fn in cases.items():
        rates = [_rate(fn, seconds) for _ in range(runs)]
        figures[name] = {
            "median_per_s": round(statistics.median(rates)),
            "min_per_s": round(min(rates)),
            "max_per_s": round(max(rates)),
        }
    return {
        "invoke_bytes": len(INVOKE),
        "result_bytes": len(encoded),
        "runs": runs,
        "seconds_per_run": seconds,
        "python": platform.python_version(),
        "orjson": orjson.__version__,
        "figures": figures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=Path("bench-results/wire_codec.json"))
    args = parser.parse_args(argv)
    report = measure(args.runs, args.seconds)
    print(f"invoke: {report['invoke_bytes']} bytes; result: {report['result_bytes']} bytes")
    print(f"{'case':<56} {'median/s':>10} {'min/s':>10} {'max/s':>10}")
    for name, fig in report["figures"].items():
        print(f"{name:<56} {fig['median_per_s']:>10} {fig['min_per_s']:>10} {fig['max_per_s']:>10}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
