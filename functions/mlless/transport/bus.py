"""``JobBus``: a job's control frames over RabbitMQ (pika), the message side of ``ServicesTransport``.

Idioms follow the pika documentation: a ``BlockingConnection`` used only from
the thread that created it, with heartbeats and ``blocked_connection_timeout``.
Publishing happens on its own channel with publisher confirms, so
``basic_publish`` returns only once the broker has the message and a direct
send to a missing queue raises (``mandatory``).  Consuming uses a second
channel so a channel error while publishing (e.g. a deleted exchange) cannot
kill the consumer.  Deliveries go into a deque via ``basic_consume`` and
``process_data_events(time_limit=…)``, which returns as soon as a delivery is
ready: this is the low-latency path.  Each message is acked when ``receive``
hands it out (the original never acked).

Outages (``mlless.transport.outage``) cover a lost connection, a broker
restart and a forced close (320 CONNECTION_FORCED, e.g. ``rabbitmqctl
close_all_connections``): the connection is made again and the topology
declared again.  A refused login fails at once, and so does a TLS certificate
the client does not trust (``amqps://``; which CAs it trusts is in
``mlless.transport.tls``).  Queues are not durable, so a broker restart loses
what they held; each bus therefore re-publishes its last ``RESEND_DEPTH``
messages after a reconnect.  That is safe because every receiver ignores what
it has already seen: a worker a step-close of a step it has applied, the
supervisor a report for a closed step, and a repeated hello, done or left.  A
re-sent message whose queue is not declared again yet (the supervisor
reconnects after its workers) is retried at the next operation.

Topology per job (queues are non-durable and carry ``x-expires`` so a crashed
job's queues vanish by themselves)::

    mlless.{job}.supervisor        the supervisor's queue
    mlless.{job}.worker.{rank}     one per worker, bound to the fanout
    mlless.{job}.workers           fanout exchange (auto-delete)
    mlless.{job}.sink              a zero-length queue bound to the fanout, so
                                   the auto-delete exchange lives while the job
                                   does and disappears when the sink expires
"""
from __future__ import annotations

import collections
import logging
import time
from typing import Callable, TypeVar

import pika
import pika.exceptions as pe

from .base import SUPERVISOR, Role, TransportError, UnroutableError, redact_url
from .outage import Outage
from .tls import TrustedCA, untrusted_certificate, untrusted_error, uses_tls

__all__ = ["JobBus", "queue_names"]

log = logging.getLogger(__name__)
# pika logs every failed connection attempt at ERROR with a traceback; during an outage that is a screenful per
# second for one fact, which this module reports itself in one line per attempt.
logging.getLogger("pika").setLevel(logging.CRITICAL)
T = TypeVar("T")

#: Messages re-published after a reconnect: more than one worker's reports in flight under SSP's default slack.
RESEND_DEPTH = 16
#: How long a consumer cancelled by the broker waits before its queue is declared again (`JobBus._declare_again`):
#: long enough for a supervisor deleting a finished job's queues to delete its exchange too.
REDECLARE_SECONDS = 1.0
#: Broker closes that no reconnect can fix: access refused (403) and not allowed (530), e.g. a missing vhost.
_REFUSED = (403, 530)


def queue_names(job_id: str) -> dict[str, str]:
    """AMQP names used by a job (also handy for operators and tests)."""
    return {
        "supervisor": f"mlless.{job_id}.supervisor",
        "worker": f"mlless.{job_id}.worker.{{rank}}",
        "exchange": f"mlless.{job_id}.workers",
        "sink": f"mlless.{job_id}.sink",
    }


class JobBus:
    """One process's connection to a job's queues; nothing is sent until the first call."""

    def __init__(
        self,
        amqp_url: str,
        *,
        job_id: str,
        role: Role,
        rank: int,
        outage_seconds: float,
        ca: TrustedCA | None,
        queue_expires: float,
        prefetch: int,
        heartbeat: int,
        blocked_connection_timeout: float,
        socket_timeout: float,
    ) -> None:
        self.job_id, self.role, self.rank = job_id, role, rank
        self.desc = redact_url(amqp_url)
        self._outage_seconds = outage_seconds
        self._ca = ca
        self._names = queue_names(job_id)
        self._own_queue = self._queue_of(rank)
        self._queue_args = {"x-expires": max(1000, int(queue_expires * 1000))}
        self._prefetch = prefetch
        try:
            self._params = pika.URLParameters(amqp_url)
        except Exception as exc:  # pika raises assorted errors on bad URLs
            raise TransportError(f"bad amqp url {self.desc}: {type(exc).__name__}") from None
        self._params.heartbeat = heartbeat
        self._params.blocked_connection_timeout = blocked_connection_timeout
        self._params.socket_timeout = socket_timeout
        self._params.connection_attempts = 1  # we do our own backoff
        # pika's own amqps:// context verifies against the system's CAs; with a private CA, one that trusts it too.
        if uses_tls("amqp", amqp_url, ca) and ca is not None:
            self._params.ssl_options = pika.SSLOptions(ca.context())
        self._conn: pika.BlockingConnection | None = None
        self._pub: pika.adapters.blocking_connection.BlockingChannel | None = None
        self._sub: pika.adapters.blocking_connection.BlockingChannel | None = None
        self._inbox: collections.deque[tuple[int, bytes]] = collections.deque()
        self._consumer_tag: str | None = None
        self._cancelled_at: float | None = None  # when the broker cancelled the consumer (its queue was deleted)
        self.closed = False
        self._connected_before = False
        # (exchange, routing key, body, mandatory) of the newest publishes, and those to publish again after a
        # reconnect with the time they became due; see the module docstring.
        self._sent: collections.deque[tuple[str, str, bytes, bool]] = collections.deque(maxlen=RESEND_DEPTH)
        self._resend: list[tuple[str, str, bytes, bool]] = []
        #: When (monotonic) the bus last reconnected (`Transport.reconnected_at`).
        self.reconnected_at = -float("inf")

    def _queue_of(self, rank: int) -> str:
        return self._names["supervisor"] if rank == SUPERVISOR else self._names["worker"].format(rank=rank)

    # ------------------------------------------------------------------ connection
    def call(self, op: Callable[[], T], window: float | None = None) -> T:
        """Run ``op`` with a live connection, waiting out an outage of up to ``outage_seconds``."""
        if self.closed:
            raise TransportError("transport is closed")
        outage = Outage(self._outage_seconds if window is None else window)
        while True:
            try:
                if self._conn is None or not self._conn.is_open:
                    self._connect()
                self._publish_again()
                return op()
            except (pe.ProbableAuthenticationError, pe.ProbableAccessDeniedError, pe.AuthenticationError) as exc:
                self._drop_connection()
                raise TransportError(f"amqp {self.desc}: login refused: {type(exc).__name__}") from None
            except pe.ConnectionClosedByBroker as exc:
                self._drop_connection()
                if exc.reply_code in _REFUSED:
                    raise TransportError(f"amqp {self.desc}: refused by the broker: {exc}") from None
                reason = f"closed by the broker ({exc.reply_code} {exc.reply_text})"
            except (pe.AMQPConnectionError, pe.ChannelWrongStateError, OSError) as exc:
                if (untrusted := untrusted_certificate(exc)) is not None:
                    self._drop_connection()
                    raise untrusted_error("amqp", self.desc, untrusted, self._ca) from None
                if isinstance(exc, pe.ChannelWrongStateError) and self._conn is not None and self._conn.is_open:
                    raise TransportError(f"amqp {self.desc}: channel closed: {exc}") from None
                self._drop_connection()
                reason = f"{type(exc).__name__}: {exc}"
            outage.wait(f"amqp {self.desc}", reason)

    def _connect(self) -> None:
        conn = pika.BlockingConnection(self._params)
        try:
            pub = conn.channel()
            pub.confirm_delivery()
            sub = conn.channel()
            sub.basic_qos(prefetch_count=self._prefetch)
            self._conn, self._pub, self._sub = conn, pub, sub
            self._declare_topology()
            self._inbox.clear()  # unacked deliveries of a dead connection are redelivered by the broker
            self._consume()
            if self._connected_before:
                log.warning("amqp %s: reconnected; re-publishing the last %d messages", self.desc, len(self._sent))
                self._resend, self.reconnected_at = list(self._sent), time.monotonic()
            self._connected_before = True
        except BaseException:
            self._conn = self._pub = self._sub = None
            try:
                conn.close()
            except Exception:
                pass
            raise

    def _declare_topology(self) -> None:
        ch = self._pub
        assert ch is not None
        ex = self._names["exchange"]
        ch.exchange_declare(ex, "fanout", durable=False, auto_delete=True)
        if self.role == "supervisor":
            sink = self._names["sink"]
            ch.queue_declare(sink, durable=False, arguments={**self._queue_args, "x-max-length": 0})
            ch.queue_bind(sink, ex)
            ch.queue_declare(self._own_queue, durable=False, arguments=self._queue_args)
        else:
            ch.queue_declare(self._own_queue, durable=False, arguments=self._queue_args)
            ch.queue_bind(self._own_queue, ex)

    def _consume(self) -> None:
        assert self._sub is not None
        self._cancelled_at = None
        self._consumer_tag = self._sub.basic_consume(self._own_queue, self._on_message, auto_ack=False)
        self._sub.add_on_cancel_callback(self._on_cancel)

    def _on_message(self, ch: object, method: pika.spec.Basic.Deliver, props: object, body: bytes) -> None:
        self._inbox.append((method.delivery_tag, body))

    def _on_cancel(self, frame: object) -> None:
        """The broker cancelled the consumer: the queue was deleted under it (by hand, or expired). A callback must
        not block, so `_declare_again` acts on it at the next receive."""
        if self._cancelled_at is None:
            self._cancelled_at = time.monotonic()

    def _declare_again(self) -> None:
        """Declare this process's queue again once its consumer has been cancelled for REDECLARE_SECONDS, so a
        deleted queue costs a step's messages (a waiting supervisor repeats its newest close) rather than the
        worker. Not when the job's exchange is gone as well: that is the supervisor deleting a finished job's
        queues, which a queue declared again would outlive."""
        if self._cancelled_at is None or time.monotonic() - self._cancelled_at < REDECLARE_SECONDS:
            return
        assert self._pub is not None
        try:
            self._pub.exchange_declare(self._names["exchange"], passive=True)
        except pe.ChannelClosedByBroker:  # 404: the job is over
            self._reopen_publisher()
            self._cancelled_at = None
            return
        log.warning("amqp %s: queue %r was deleted under its consumer; declared again", self.desc, self._own_queue)
        self._declare_topology()
        self._consume()

    def _reopen_publisher(self) -> None:
        """A new publishing channel, with confirms, after the broker closed the last one (a channel error)."""
        assert self._conn is not None
        self._pub = self._conn.channel()
        self._pub.confirm_delivery()

    def _recovering(self) -> bool:
        """Within the outage window after a reconnect: a queue may not be declared again yet."""
        return time.monotonic() - self.reconnected_at < self._outage_seconds

    def _publish_again(self) -> None:
        """Re-publish the messages due since a reconnect; one whose queue is not back yet waits for the next call,
        until the outage window has passed."""
        while self._resend:
            exchange, routing_key, body, mandatory = self._resend[0]
            assert self._pub is not None
            try:
                self._pub.basic_publish(exchange, routing_key, body, mandatory=mandatory)
            except pe.UnroutableError:
                if not self._recovering():
                    log.error("amqp %s: queue %r never came back; %d messages not re-sent", self.desc,
                              routing_key, len(self._resend))
                    self._resend = []
                return
            self._resend.pop(0)

    def _drop_connection(self) -> None:
        conn, self._conn, self._pub, self._sub = self._conn, None, None, None
        self._inbox.clear()
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except Exception:
                pass

    # ------------------------------------------------------------------ the job's queues
    def delete_queues(self, ranks: list[int]) -> None:
        """Delete the job's queues (the supervisor's, the sink, those of ``ranks`` and this worker's own) and its
        exchange."""
        queues = [self._names["supervisor"], self._names["sink"]] + [self._queue_of(r) for r in ranks]
        if self.role == "worker" and self._own_queue not in queues:
            queues.append(self._own_queue)

        def drop() -> None:
            ch = self._pub
            assert ch is not None and self._sub is not None
            # Stop consuming first: deleting a queue under a live consumer makes the broker cancel it,
            # and pika logs that cancel as an unknown consumer.
            if self._consumer_tag is not None:
                self._sub.basic_cancel(self._consumer_tag)
                self._consumer_tag = None
            for q in queues:
                ch.queue_delete(q)
            ch.exchange_delete(self._names["exchange"])

        self.call(drop)
        self._inbox.clear()

    def purge(self, ranks: list[int]) -> None:
        """Empty this process's queue and those of ``ranks``, which stay, with their consumers."""

        def run() -> None:
            ch = self._pub
            assert ch is not None
            for q in [self._own_queue, *(self._queue_of(r) for r in ranks)]:
                # Declared first (the same arguments, so a no-op if it is there): purging an expired queue would
                # close the channel.
                ch.queue_declare(q, durable=False, arguments=self._queue_args)
                ch.queue_purge(q)
            if self._inbox:  # delivered already: acknowledged, or the broker would deliver them again
                assert self._sub is not None
                self._sub.basic_ack(self._inbox[-1][0], multiple=True)

        self.call(run)
        self._inbox.clear()
        self._sent.clear()  # a reconnect must not re-publish the predecessor's messages into the clean slate

    # ------------------------------------------------------------------ messages
    def _publish(self, exchange: str, routing_key: str, body: bytes, *, mandatory: bool) -> None:
        def op() -> None:
            ch = self._pub
            assert ch is not None
            try:
                ch.basic_publish(exchange, routing_key, body, mandatory=mandatory)
                self._sent.append((exchange, routing_key, body, mandatory))
            except pe.UnroutableError:
                if self._recovering():  # its queue comes back when its owner reconnects
                    self._resend.append((exchange, routing_key, body, mandatory))
                    self._sent.append((exchange, routing_key, body, mandatory))
                    return
                raise UnroutableError(f"no queue {routing_key!r} in job {self.job_id}") from None
            except pe.NackError:
                raise TransportError(f"broker nacked a message to {routing_key or exchange!r}") from None
            except pe.ChannelClosedByBroker as exc:
                # e.g. the exchange was deleted: reopen the publishing channel, report the error.
                self._reopen_publisher()
                raise TransportError(f"amqp publish to {exchange or routing_key!r} refused: {exc}") from None

        self.call(op)

    def send_to_supervisor(self, body: bytes) -> None:
        self._publish("", self._names["supervisor"], body, mandatory=True)

    def broadcast(self, body: bytes) -> None:
        # Not mandatory: the sink queue makes every publish routable, and zero workers is legal.
        self._publish(self._names["exchange"], "", body, mandatory=False)

    def receive(self, timeout: float | None) -> bytes | None:
        """The next body in this process's queue, acknowledged; None after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)

        def op() -> bytes | None:
            while True:
                self._declare_again()
                if self._inbox:
                    tag, body = self._inbox.popleft()
                    assert self._sub is not None
                    self._sub.basic_ack(tag)  # receipt is handling
                    return body
                remaining = 1.0 if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    assert self._conn is not None
                    self._conn.process_data_events(time_limit=0)
                    if not self._inbox:
                        return None
                    continue
                assert self._conn is not None
                # Returns as soon as a delivery is dispatched; caps keep heartbeats flowing.
                self._conn.process_data_events(time_limit=min(remaining, 1.0))

        return self.call(op)

    def close(self) -> None:
        self.closed = True
        self._drop_connection()
