"""Drives the server with the official A2A Python SDK's 0.3 client.

Usage: python client_v0_3.py http://127.0.0.1:PORT [JSONRPC|HTTP+JSON]

Needs a2a-sdk==0.3.26 (the last 0.3 release line). Connects through the
card with the client's defaults (its card resolver and ClientFactory;
the transport is JSON-RPC unless named), then against the demo agents:
a blocking send that completes, a get, a streamed send, and a
non-blocking send of a slow task that it cancels. Prints one line per
step and exits 1 at the first step whose outcome is wrong. Run by
tests/v0_3.rs when A2A_TEST_PYTHON_V03 names a Python that has the SDK.
"""

import asyncio
import sys
import uuid

import httpx

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    Message,
    Part,
    Role,
    TaskIdParams,
    TaskQueryParams,
    TaskState,
    TaskStatusUpdateEvent,
    TextPart,
)


def message(text):
    return Message(
        role=Role.user,
        message_id=str(uuid.uuid4()),
        parts=[Part(root=TextPart(text=text))],
    )


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        sys.exit(1)


async def main():
    base = sys.argv[1]
    transports = sys.argv[2:3]  # empty: the client's default (JSON-RPC)
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, base).get_agent_card()
        check(card.url.startswith(base), f"card: url {card.url}, {card.preferred_transport}")

        def client(**config):
            cfg = ClientConfig(httpx_client=http, supported_transports=transports, **config)
            return ClientFactory(cfg).create(card)

        task = None
        async for event in client(streaming=False).send_message(message("run the tests")):
            task = event[0]
        check(task.status.state == TaskState.completed, f"send: {task.status.state}")
        check(task.artifacts and task.artifacts[0].name == "test-report", "send: the report")

        got = await client().get_task(TaskQueryParams(id=task.id, history_length=1))
        check(got.id == task.id and len(got.history) == 1, f"get: {got.status.state}")

        states = []
        async for current, update in client(streaming=True).send_message(message("run the tests")):
            if isinstance(update, TaskStatusUpdateEvent):
                states.append((update.status.state, update.final))
        check(
            states and states[-1] == (TaskState.completed, True),
            f"stream: {[s.value for s, _ in states]}, final on the last",
        )

        slow = None
        async for current, _ in client(streaming=False, polling=True).send_message(
            message("run the slow tests")
        ):
            slow = current
        check(slow.status.state in (TaskState.submitted, TaskState.working), "non-blocking send")
        canceled = await client().cancel_task(TaskIdParams(id=slow.id))
        check(canceled.status.state == TaskState.canceled, f"cancel: {canceled.status.state}")


if __name__ == "__main__":
    asyncio.run(main())
