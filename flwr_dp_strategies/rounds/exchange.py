"""One message exchange of a round: ``Grid.send_and_receive``, and not waiting for a node that left.

Flower 1.41 and 1.42 answer a message whose destination node died with an error reply from the SuperLink, so
``send_and_receive`` returns once every message is answered. Flower 1.43 drops such a reply instead (the pull of
its objects fails, and is logged), so ``send_and_receive`` waits for it until its ``timeout`` (3600 s by default
in ``Strategy.start``). :func:`exchange` pushes and pulls as ``send_and_receive`` does (the grid's own
``pull_interval`` between pulls, else Flower's 3 s, at first faster) and, between pulls, stops waiting for a
message whose node was connected when it was sent and is no longer (``grid.get_node_ids()``): for the round that
node is a dropout, as a failed reply is on 1.41–1.42, and the round goes on with the others. A push Flower 1.43
could not make (message id ``""``) is not waited for either. Nothing here reads a reply's content.

A Grid whose class defines its own ``send_and_receive`` outside Flower (a wrapper an app puts around Flower's
Grid to log or count replies, a test grid) is called through it, as Flower's ``Strategy.start`` would call it:
its behaviour is the app's (``examples/quickstart``'s ``ReplyLog`` calls :func:`exchange` itself).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import WARNING
from typing import Optional

from flwr.app import Message
from flwr.common.logger import log
from flwr.serverapp import Grid

FIRST_POLL = 0.05
DEFAULT_POLL = 3.0  # Flower's HttpGrid


def exchange(grid: Grid, messages: Iterable[Message], timeout: Optional[float]) -> list[Message]:
    """Push ``messages``, pull their replies until all are in, ``timeout`` seconds passed, or only nodes that left
    the federation are still awaited (module docstring)."""
    messages = list(messages)
    if not messages:
        return []
    own = getattr(type(grid), "send_and_receive", None)
    if own is not None and not getattr(own, "__module__", "").startswith("flwr."):
        return list(grid.send_and_receive(messages, timeout=timeout))
    return push_and_pull(grid, messages, timeout)


def push_and_pull(grid: Grid, messages: list[Message], timeout: Optional[float]) -> list[Message]:
    """The pull loop of :func:`exchange` (a Flower Grid's ``send_and_receive`` less the wait for a node that left)."""
    if not messages:
        return []
    connected = set(grid.get_node_ids())
    ids = list(grid.push_messages(messages))
    destination = {mid: int(m.metadata.dst_node_id) for mid, m in zip(ids, messages) if mid}
    unpushed = len(messages) - len(destination)
    if unpushed:
        log(WARNING, "%d message(s) could not be pushed: not waiting for a reply to them", unpushed)
    pending = set(destination)
    end = None if timeout is None else time.monotonic() + timeout
    interval = float(getattr(grid, "pull_interval", DEFAULT_POLL))
    poll = min(FIRST_POLL, interval)
    replies: list[Message] = []
    while pending:
        got = list(grid.pull_messages(sorted(pending)))  # positional: every supported Flower's first parameter
        replies.extend(got)
        pending.difference_update(reply.metadata.reply_to_message_id for reply in got)
        if not pending or (end is not None and time.monotonic() >= end):
            break
        now = set(grid.get_node_ids())
        gone = {mid for mid in pending if destination[mid] in connected and destination[mid] not in now}
        if gone:
            log(
                WARNING,
                "Node(s) %s left the federation: not waiting for their replies (a dropout for this round)",
                ", ".join(str(n) for n in sorted({destination[mid] for mid in gone})),
            )
            pending -= gone
            if not pending:
                break
        time.sleep(poll if end is None else max(0.0, min(poll, end - time.monotonic())))
        poll = min(interval, poll * 2)
    return replies


__all__ = ["exchange", "push_and_pull"]
