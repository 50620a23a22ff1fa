"""The one in-process Grid of the tests, and the one round driver.

:class:`LoopbackGrid` implements :class:`flwr.serverapp.Grid` as the strategies use it. Every message
pushed is delivered, in process, to its destination node's client: a ClientApp-like callable
``(Message) -> Message`` or ``(Message, Context) -> Message``, or a Flower :class:`~flwr.clientapp.ClientApp`
(mods included), each node with its own :class:`~flwr.app.Context` kept across rounds. Metadata is set
as the SuperLink sets it: every pushed message gets a fresh message ID, the reply's ``reply_to_message_id``
is that ID, its ``src_node_id`` the node's and its ``dst_node_id`` the sender's. A node in ``drop`` answers
as a vanished node does on a SuperLink: an error reply (``NODE_UNAVAILABLE``) whose source is the
SuperLink; a client that raises answers with an error reply (``CLIENT_APP_RAISED_EXCEPTION``) from its node.

A grid without clients (``LoopbackGrid.of(n)``) only lists its nodes (101, 102, ...): what
``configure_*`` needs when a test builds the replies itself.

:func:`run_round` is configure -> send_and_receive -> aggregate, for train or evaluate.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any, Callable, Iterable, NamedTuple, Optional, Union

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

try:
    from flwr.supercore.run import Run
except ImportError:  # pragma: no cover - older layouts
    from flwr.common.typing import Run  # type: ignore[no-redef]

SUPERLINK_NODE_ID = 1  # flwr.common.constant.SUPERLINK_NODE_ID: the source of the SuperLink's own error replies
CLIENT_APP_RAISED_EXCEPTION = 2  # flwr.common.constant.ErrorCode
NODE_UNAVAILABLE = 5

Client = Union[ClientApp, Callable[..., Message]]


def node_context(node: int, run_id: int = 1) -> Context:
    return Context(run_id=run_id, node_id=node, node_config={}, state=RecordDict(), run_config={})


def _takes_context(fn: Callable[..., Any]) -> bool:
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        return True
    return len(params) >= 2


class LoopbackGrid(Grid):
    """A Grid whose nodes run client functions in process.

    Args:
        clients: one client for every node, or ``{node_id: client}``; ``None``: the nodes only exist
            (sending to them is an error).
        node_ids: the nodes (default: the keys of ``clients``).
        drop: nodes that are gone: their replies are the SuperLink's ``NODE_UNAVAILABLE`` error replies.
        tamper: ``(message, reply) -> reply``, applied to every reply before the server sees it.
        by_index: ``(i, message) -> reply`` answers the i-th message of each send (tests that pair
            prepared replies with the messages in the order the strategy sent them); overrides ``clients``.

    A client (or ``by_index``) that returns None stays silent: no reply comes, as when a node does not
    answer before ``send_and_receive``'s timeout.
    """

    def __init__(
        self,
        clients: Union[Client, dict[int, Client], None] = None,
        node_ids: Optional[Iterable[int]] = None,
        *,
        drop: Iterable[int] = (),
        tamper: Optional[Callable[[Message, Message], Message]] = None,
        run_id: int = 1,
        by_index: Optional[Callable[[int, Message], Message]] = None,
    ) -> None:
        if node_ids is None:
            if not isinstance(clients, dict):
                raise TypeError("node_ids are needed unless clients is a {node_id: client} dict")
            node_ids = list(clients)
        self.node_ids = [int(n) for n in node_ids]
        self.clients: dict[int, Client] = (
            dict(clients)
            if isinstance(clients, dict)
            else {n: clients for n in self.node_ids}
            if clients is not None
            else {}
        )
        self.contexts = {n: node_context(n, run_id) for n in self.node_ids}
        self.drop = set(drop)
        self.tamper = tamper
        self.by_index = by_index
        self.batch_index = 0  # the index of the message being delivered within its push
        self.sent: list[Message] = []  # every message pushed, in order
        self.received: list[Message] = []  # every reply pulled, in order
        self.errors: list[str] = []  # "node: exception" of every client that raised
        self._run = Run.create_empty(run_id)
        self._pending: dict[str, Message] = {}
        self._ids = itertools.count(1)

    @classmethod
    def of(
        cls, num_nodes: int, clients: Union[Client, dict[int, Client], None] = None, **kwargs: Any
    ) -> "LoopbackGrid":
        """``num_nodes`` nodes with IDs 101, 102, ..."""
        return cls(clients, range(101, 101 + num_nodes), **kwargs)

    # ------------------------------------------------------------------ Grid
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: Optional[float] = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for index, msg in enumerate(messages):
            self.batch_index = index
            if msg.metadata.reply_to_message_id:
                raise ValueError(f"a reply cannot be pushed: {msg.metadata}")
            message_id = f"loopback-{next(self._ids)}"
            msg.metadata.__dict__["_message_id"] = message_id  # as the SuperLink does on push
            self.sent.append(msg)
            reply = self._reply(msg)
            if reply is not None:  # None: the node stays silent (its reply never comes before the timeout)
                self._pending[message_id] = reply
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        replies = [self._pending.pop(i) for i in message_ids if i in self._pending]
        self.received.extend(replies)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: Optional[float] = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))

    # ------------------------------------------------------------------ delivery
    def _reply(self, msg: Message) -> Optional[Message]:
        node = int(msg.metadata.dst_node_id)
        if node not in self.contexts:
            raise ValueError(f"no node {node} in this grid ({self.node_ids})")
        reply = self.deliver(node, msg)
        if reply is not None and self.tamper is not None:
            reply = self.tamper(msg, reply)
        return reply

    def deliver(self, node: int, msg: Message) -> Optional[Message]:
        """The reply of ``node`` to ``msg``, or None if it never answers (subclasses: adversarial or failing
        nodes)."""
        if node in self.drop:
            return self.unavailable_reply(node, msg)
        if self.by_index is not None:  # the test's own replies: its errors are the test's, not a client's
            reply = self.by_index(self.batch_index, msg)
            return None if reply is None else self.stamp(node, reply)
        try:
            reply = self.call_client(node, msg)
        except Exception as err:  # noqa: BLE001 - the SuperNode turns it into an error reply
            self.errors.append(f"{node}: {err}")
            return self.raised_reply(node, msg, err)
        return None if reply is None else self.stamp(node, reply)

    def call_client(self, node: int, msg: Message) -> Message:
        if node not in self.clients:
            raise RuntimeError(f"LoopbackGrid: node {node} has no client (a grid for configure_* only)")
        client = self.clients[node]
        if isinstance(client, ClientApp) or _takes_context(client):
            return client(msg, self.contexts[node])
        return client(msg)

    @staticmethod
    def stamp(node: int, reply: Message, src: Optional[int] = None) -> Message:
        reply.metadata.__dict__["_src_node_id"] = node if src is None else src
        return reply

    def unavailable_reply(self, node: int, msg: Message) -> Message:
        """What the SuperLink returns for a node that stopped sending heartbeats."""
        reply = Message(
            Error(code=NODE_UNAVAILABLE, reason="The destination node failed to report a heartbeat"), reply_to=msg
        )
        return self.stamp(node, reply, src=SUPERLINK_NODE_ID)

    def raised_reply(self, node: int, msg: Message, err: Exception) -> Message:
        return self.stamp(node, Message(Error(code=CLIENT_APP_RAISED_EXCEPTION, reason=str(err)), reply_to=msg))


class Round(NamedTuple):
    messages: list[Message]
    replies: list[Message]
    result: Any  # what aggregate_train / aggregate_evaluate returned


def run_round(
    strategy: Any,
    grid: Grid,
    arrays: Any,
    server_round: int = 1,
    config: Optional[ConfigRecord] = None,
    *,
    phase: str = "train",
    timeout: Optional[float] = None,
) -> Round:
    """One round of ``phase`` ("train" or "evaluate"): configure, send and receive, aggregate."""
    if phase not in ("train", "evaluate"):
        raise ValueError(f"phase must be 'train' or 'evaluate', not {phase!r}")
    configure = getattr(strategy, f"configure_{phase}")
    aggregate = getattr(strategy, f"aggregate_{phase}")
    messages = list(configure(server_round, arrays, config if config is not None else ConfigRecord(), grid))
    replies = list(grid.send_and_receive(messages, timeout=timeout)) if messages else []
    return Round(messages, replies, aggregate(server_round, replies))
