"""The messages of the session's exchange (``serving/exchange.py``): one frozen dataclass per
message, told apart by its ``type``, encoded and decoded here only.

A worker sends requests and gets one reply each (matched by ``ref`` in the frame); the
exchange also pushes events (``ref`` 0) when something happens that a worker waits for: a
server became ready for its item, a server it uses was lost, a server it serves was released,
or work may be waiting. Events are numbered per worker (``seq``, from 1): a worker's
:class:`Hello` on a connection it made again says the last one it received, and the exchange
replays the later ones it keeps (the last ``KEPT_EVENTS``); a worker ignores one it has seen.
A request whose effect must not be lost (:func:`lasting`) is sent again once a dropped
connection is made again; the exchange takes a repeat without a second effect.
"""

from __future__ import annotations

import json
import types
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, TypeAlias, Union, cast, get_args, get_origin, get_type_hints

SCHEMA_VERSION = 2  # 2: numbered events, replayed on a resume
RESUME_S = 12.0  # a worker whose connection dropped may connect again this long, as itself
CLEAN_CLOSE = (1000, 1001)  # WebSocket close codes of a side that ended it on purpose
PATH = "/exchange"  # where the exchange accepts WebSockets
KEPT_EVENTS = 512  # the last events pushed to a worker, kept to replay on its resume

__all__ = [
    "PATH",
    "Ack",
    "AskWork",
    "GpusGiven",
    "Hello",
    "LeaseEnded",
    "LeaseLost",
    "LeaseReady",
    "LiveServer",
    "Message",
    "NoWork",
    "Offer",
    "Publish",
    "Release",
    "SessionGpus",
    "ShareLost",
    "ShareServer",
    "SharedWith",
    "SharersGone",
    "Unshare",
    "WaitGpus",
    "Wake",
    "WantAnswer",
    "WantServers",
    "Withdraw",
    "Withdrawn",
    "Work",
    "decode",
    "decode_frame",
    "encode",
    "lasting",
]


@dataclass(frozen=True)
class Hello:
    """First message on a connection: which worker holds it (its close is that worker's end)."""

    type: ClassVar[str] = "hello"
    worker: str
    """The xdist worker id (``gw3``)."""
    schema_version: int = SCHEMA_VERSION
    seen: int = 0
    """The last event (``seq``) the worker received; the exchange replays the later ones."""


@dataclass(frozen=True)
class WantServers:
    """A keeper's step: ``need`` servers of ``key`` from other nodes would pay now, counting
    those they are starting for it; ``lend``: live ones are welcome (its item has work left)."""

    type: ClassVar[str] = "want"
    keeper: str
    node: str
    """The keeper's node (host name and GPU claim directory)."""
    key: str
    """The launch key: servers of equal launches are interchangeable."""
    launch: dict[str, Any]
    """The launch's fields (``Launch.fields``), for a helper to start it."""
    need: int
    lend: bool = False


@dataclass(frozen=True)
class WantAnswer:
    """How many servers other nodes are starting for the keeper, and the GPUs of its node
    that workers of the session gave back (for replicas)."""

    type: ClassVar[str] = "want-answer"
    starting: int
    given: tuple[str, ...] = ()


@dataclass(frozen=True)
class SessionGpus:
    """A worker gave ``gpus`` of ``node`` back to the session (``free``), or found them taken
    (claimed for a replica, or by another session: not ``free``)."""

    type: ClassVar[str] = "session-gpus"
    node: str
    gpus: tuple[str, ...]
    free: bool = True


@dataclass(frozen=True)
class Release:
    """A keeper lets lease ``lease`` go (None: every lease, and its want)."""

    type: ClassVar[str] = "release"
    keeper: str
    lease: str | None = None


@dataclass(frozen=True)
class LiveServer:
    """A helper's running server: its launch ``key``, ``port``, whether it serves TLS, and
    whether other nodes reach it (``remote``; else it is lent on its node only)."""

    type: ClassVar[str] = "live"
    key: str
    port: int
    tls: bool
    remote: bool = True


@dataclass(frozen=True)
class AskWork:
    """A helper (a worker at its end, its GPUs still claimed) asks for work."""

    type: ClassVar[str] = "ask-work"
    helper: str
    node: str
    gpus: int
    live: LiveServer | None = None


@dataclass(frozen=True)
class Work:
    """Start ``launch`` for lease ``lease`` (``lent``: the helper's live server serves it)."""

    type: ClassVar[str] = "work"
    lease: str
    key: str
    launch: dict[str, Any]
    lent: bool = False


@dataclass(frozen=True)
class NoWork:
    """No work now: ``local``, a keeper of the helper's node wants its GPUs, or a worker of
    its node waits for GPUs; ``wait``, items may still want servers (ask again when woken);
    neither, none will."""

    type: ClassVar[str] = "no-work"
    local: bool = False
    wait: bool = False


@dataclass(frozen=True)
class Offer:
    """The helper's server for ``lease`` serves on ``port``, or (``note``) did not start or
    died."""

    type: ClassVar[str] = "offer"
    lease: str
    port: int | None = None
    tls: bool = False
    note: str | None = None


@dataclass(frozen=True)
class Ack:
    type: ClassVar[str] = "ack"
    error: str | None = None
    """Why the request was not understood (the connection stays)."""


@dataclass(frozen=True)
class LeaseReady:
    """Pushed to a keeper: a server of another node serves its item at ``url``."""

    type: ClassVar[str] = "lease-ready"
    lease: str
    url: str


@dataclass(frozen=True)
class LeaseLost:
    """Pushed to a keeper: the server of ``lease`` did not start, died, or its worker left."""

    type: ClassVar[str] = "lease-lost"
    lease: str
    note: str


@dataclass(frozen=True)
class LeaseEnded:
    """Pushed to a helper: its keeper released ``lease`` (or left): stop serving it."""

    type: ClassVar[str] = "lease-ended"
    lease: str


@dataclass(frozen=True)
class Publish:
    """An owner opens its running server of ``key`` at ``url`` to the session's workers of
    its ``node`` that have no GPU (they share it while their items run)."""

    type: ClassVar[str] = "publish"
    key: str
    node: str
    url: str


@dataclass(frozen=True)
class Withdraw:
    """The owner withdraws its server of ``key``: nobody new shares it."""

    type: ClassVar[str] = "withdraw"
    key: str
    lost: str | None = None
    """Why its sharers lose it now (it died, or stops without waiting for them); None: they
    keep it until they let go."""


@dataclass(frozen=True)
class Withdrawn:
    """How many workers still send to the withdrawn server (:class:`SharersGone` follows
    when they have all let go)."""

    type: ClassVar[str] = "withdrawn"
    sharers: int


@dataclass(frozen=True)
class ShareServer:
    """A worker without a GPU asks for a running server of ``key`` on its ``node``."""

    type: ClassVar[str] = "share"
    key: str
    node: str


@dataclass(frozen=True)
class SharedWith:
    """The server at ``url`` of worker ``owner``, shared as ``share`` until let go."""

    type: ClassVar[str] = "shared-with"
    share: str
    url: str
    owner: str


@dataclass(frozen=True)
class Unshare:
    """The sharer lets go of ``share`` (its item ended)."""

    type: ClassVar[str] = "unshare"
    share: str


@dataclass(frozen=True)
class SharersGone:
    """Pushed to an owner: every worker sharing its withdrawn server of ``key`` let go."""

    type: ClassVar[str] = "sharers-gone"
    key: str


@dataclass(frozen=True)
class ShareLost:
    """Pushed to a sharer: the server of ``share`` is gone (its worker ended)."""

    type: ClassVar[str] = "share-lost"
    share: str
    note: str


@dataclass(frozen=True)
class GpusGiven:
    """Pushed to the keepers of a node: workers of the session gave ``gpus`` back there."""

    type: ClassVar[str] = "gpus-given"
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class WaitGpus:
    """A worker without a GPU waits on its ``node`` for GPUs that workers of the session hold
    there, or for a server to share (``waiting`` False: it stopped waiting). It is pushed
    :class:`GpusGiven` when GPUs of its node are given back, and :class:`Wake` when a worker
    ends or a server of its node is published."""

    type: ClassVar[str] = "wait-gpus"
    node: str
    waiting: bool = True


@dataclass(frozen=True)
class Wake:
    """Pushed to waiting helpers: a want opened or a worker ended; ask for work again."""

    type: ClassVar[str] = "wake"


Message: TypeAlias = (
    Hello
    | WantServers
    | WantAnswer
    | Release
    | LiveServer
    | AskWork
    | Work
    | NoWork
    | Offer
    | Ack
    | LeaseReady
    | LeaseLost
    | LeaseEnded
    | SessionGpus
    | GpusGiven
    | Publish
    | Withdraw
    | Withdrawn
    | ShareServer
    | SharedWith
    | Unshare
    | SharersGone
    | ShareLost
    | WaitGpus
    | Wake
)
_TYPES: dict[str, type[Any]] = {
    kind.type: kind
    for kind in (
        Hello,
        WantServers,
        WantAnswer,
        Release,
        LiveServer,
        AskWork,
        Work,
        NoWork,
        Offer,
        Ack,
        LeaseReady,
        LeaseLost,
        LeaseEnded,
        SessionGpus,
        GpusGiven,
        Publish,
        Withdraw,
        Withdrawn,
        ShareServer,
        SharedWith,
        Unshare,
        SharersGone,
        ShareLost,
        WaitGpus,
        Wake,
    )
}


def _fields(message: Message) -> dict[str, Any]:
    body = asdict(message)
    for name in body:  # nested messages keep their type
        nested = getattr(message, name)
        if type(nested) in _TYPES.values():
            body[name] = _fields(nested)
    return {"type": message.type, **body}


def encode(message: Message, ref: int = 0, seq: int = 0) -> str:
    """One frame: the message and the request it answers (0: an event), and an event's
    number for its worker (``seq``, from 1; 0: not numbered)."""
    return json.dumps({"ref": ref, "seq": seq, "msg": _fields(message)})


def lasting(message: Message) -> bool:
    """Whether a request's effect must not be lost to a dropped connection: it is sent again
    once the connection is made again (the exchange takes a repeat without a second effect)."""
    if isinstance(message, WaitGpus):
        return not message.waiting
    return isinstance(message, (Release, Offer, Publish, Withdraw, Unshare))


def _build(fields: Any) -> Message:
    if not isinstance(fields, dict) or fields.get("type") not in _TYPES:
        raise ValueError(f"not a message of the exchange: {fields!r:.200}")
    kind = _TYPES[fields["type"]]
    values = {k: v for k, v in fields.items() if k != "type"}
    for name, value in values.items():
        if isinstance(value, dict) and "type" in value:
            values[name] = _build(value)
        elif isinstance(value, list):
            values[name] = tuple(value)
    try:
        message = kind(**values)
    except TypeError as exc:
        raise ValueError(f"{fields['type']}: {exc}") from None
    for name, hint in _FIELDS[kind].items():
        value = getattr(message, name)
        if not _fits(value, hint):
            shown = hint.__name__ if isinstance(hint, type) else str(hint)
            raise ValueError(f"{kind.type}: {name} is not a {shown} ({value!r:.100})")
    return cast(Message, message)


def _fits(value: Any, hint: Any) -> bool:
    """Whether a decoded ``value`` is of the type a message's field declares (str, int,
    float, bool, None, unions, ``tuple[X, ...]``, ``dict[str, X]``, nested messages)."""
    origin = get_origin(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin in (Union, types.UnionType):
        return any(_fits(value, arg) for arg in get_args(hint))
    if origin is tuple:
        item = get_args(hint)[0]
        return isinstance(value, tuple) and all(_fits(v, item) for v in value)
    if origin is dict:
        key, item = get_args(hint)
        return isinstance(value, dict) and all(
            _fits(k, key) and _fits(v, item) for k, v in value.items()
        )
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)


_FIELDS = {  # each message's fields and their types, as its dataclass declares them
    kind: {f.name: get_type_hints(kind)[f.name] for f in fields(kind)} for kind in _TYPES.values()
}


def decode(frame: str | bytes) -> tuple[int, Message]:
    """(ref, message) of a frame; ValueError when it is not one."""
    ref, _, message = decode_frame(frame)
    return ref, message


def decode_frame(frame: str | bytes) -> tuple[int, int, Message]:
    """(ref, seq, message) of a frame; ValueError when it is not one."""
    data = json.loads(frame)
    numbers = (data.get("ref"), data.get("seq", 0)) if isinstance(data, dict) else (None,)
    if not all(_fits(number, int) for number in numbers):
        raise ValueError(f"not a frame of the exchange: {str(frame)[:200]}")
    return int(data["ref"]), int(data.get("seq", 0)), _build(data.get("msg"))
