"""The loop starts its scenario only once the analytics worker has caught up (issue 17,
finding 7): a new consumer group reads its topics from the start, and a worker that loaded its
model on a busy machine met the first fault 9 s behind, acting after the fault had ended.
Real broker (the stack fixture)."""

from __future__ import annotations

from cgloop.analytics.worker import INPUT_TOPICS
from cgloop.bus.topics import FLOWS
from cgloop.config import Settings, kafka_client_config
from cgloop.loop.closed_loop import ANALYTICS_TOPICS
from cgloop.loop.services import group_caught_up
from cgloop.testing import kafka_answer
from confluent_kafka import Consumer, Producer

TOPIC = FLOWS.name
def test_the_loop_waits_for_the_topics_the_worker_reads():
    assert set(ANALYTICS_TOPICS) == set(INPUT_TOPICS)


def _consume(consumer: Consumer, n: int) -> None:
    got = 0
    while got < n:
        msg = consumer.poll(10)
        assert msg is not None, f"only {got} of {n} messages arrived"
        if msg.error() is None:
            got += 1
            consumer.commit(msg, asynchronous=False)


def test_caught_up_only_once_the_backlog_before_it_is_committed(stack_settings: Settings):
    bootstrap = stack_settings.bootstrap_servers
    producer = Producer(kafka_client_config(bootstrap))
    for i in range(6):
        producer.produce(TOPIC, value=b"backlog %d" % i, partition=0)
    assert producer.flush(10) == 0
    group = "loop-readiness-test"
    ready = group_caught_up(bootstrap, group, ANALYTICS_TOPICS)
    consumer = Consumer({**kafka_client_config(bootstrap), "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        assert not kafka_answer(ready), "nothing handled yet"
        consumer.subscribe([TOPIC])
        _consume(consumer, 4)
        assert not kafka_answer(ready), "two messages of the backlog are still to be handled"
        # what arrives after the first question is not backlog: it does not move the mark
        for i in range(3):
            producer.produce(TOPIC, value=b"live %d" % i, partition=0)
        assert producer.flush(10) == 0
        _consume(consumer, 2)
        assert kafka_answer(ready)
    finally:
        consumer.close()


def test_a_ready_line_an_earlier_run_left_in_the_log_does_not_pass_for_this_one(tmp_path):
    """Logs are appended across runs: `make run` once went on before its node agent listened,
    because the previous run's "listening on" was still in the agent's log."""
    import sys

    from cgloop.loop.services import Services

    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "agent.log").write_text("old run\nlistening on unix:/old.sock\n")
    services = Services(lab=None, log_dir=log_dir)
    svc = services.spawn_host("agent", [sys.executable, "-c", "print('starting', flush=True)"])
    try:
        svc.proc.wait(10)
        ready = services.log_says(svc, "listening on")
        assert not ready()
        assert svc.tail() == "starting"
        with open(svc.log, "a") as f:
            f.write("listening on unix:/new.sock\n")
        assert ready()
    finally:
        services.stop()
