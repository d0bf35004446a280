"""The ACLs `undertow acls` generates, enforced by a real broker with KRaft's authorizer on: each
component's login may do its job, and a rollout worker's (the hosts that run untrusted tool code)
is refused what would steer training: writing ready or weights, committing the trainer's group,
reading another namespace. Each refusal is checked to lift once the ACL is widened, so it is the
ACL that refuses and not something else. Then the SCRAM logins `undertow run` makes, rotated, and
the quotas."""

from __future__ import annotations


import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from typer.testing import CliRunner

from undertow.infra.broker.local import LocalKafka, free_port_block
from undertow.infra.cli import app
from undertow.infra.run.access import run_acls
from undertow.streams import KafkaSettings, RecordProducer, Topics, create_topics, record_counts
from undertow.streams.admin import TopicNotFound, topic_partitions
from undertow.streams.access import Acl, AclsRefused, Quota, apply, remove_logins, set_logins, set_quotas
from undertow.streams.connect import KafkaUnreachable, connect
from tests.helpers import wait_for, write_config

pytestmark = [pytest.mark.broker, pytest.mark.slow]
COMPONENTS = ("rollout", "trainer", "processors")
USERS = {"admin": "admin-secret", **{f"lab-{c}": f"{c}-secret" for c in COMPONENTS}}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    local = LocalKafka(tmp_path_factory.mktemp("acl-kafka"), port=free_port_block(2), sasl_users=USERS,
                       acls=True).start()
    try:
        yield local
    finally:
        local.stop()


def login(broker: LocalKafka, user: str) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=broker.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                         sasl_mechanism="PLAIN", sasl_username=user, sasl_password=USERS[user])


@pytest.fixture(scope="module")
def lab(broker, tmp_path_factory):
    """Namespaces lab and other made by the super user, lab's ACLs applied with `undertow acls --apply`."""
    admin = login(broker, "admin")
    create_topics(admin, "lab")
    create_topics(admin, "other")
    path = write_config(tmp_path_factory.mktemp("acl-run") / "run.yaml", "lab",
                        kafka=admin.model_dump(exclude_none=True))
    # --bootstrap reads $UNDERTOW_BOOTSTRAP (the session's broker under xdist) and wins over the config's
    out = CliRunner().invoke(app, ["acls", str(path), "--apply"], env={"UNDERTOW_BOOTSTRAP": None})
    assert out.exit_code == 0 and "created" in out.output, out.output
    return admin


def producer(broker: LocalKafka, user: str) -> KafkaProducer:
    return connect(KafkaProducer, login(broker, user), acks="all", enable_idempotence=True, max_block_ms=20000)


def send(broker: LocalKafka, user: str, topic: str) -> None:
    """One record to `topic` as `user`, waiting for its acknowledgement (raises the broker's refusal)."""
    p = producer(broker, user)
    try:
        p.send(topic, b"x", key=b"k").get(timeout=30)  # weights is compacted: keyed
    finally:
        p.close(timeout=5)


def test_each_login_does_its_job(broker, lab):
    t = Topics("lab")
    send(broker, "lab-rollout", t.raw)
    send(broker, "lab-processors", t.ready)
    send(broker, "lab-trainer", t.weights)
    assert record_counts(lab, [t.raw, t.ready, t.weights]) == {t.raw: 1, t.ready: 1, t.weights: 1}
    # The rollout group on tasks: join, fetch and commit as the rollout login.
    consumer = connect(KafkaConsumer, login(broker, "lab-rollout"), group_id="lab.rollout",
                       enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        consumer.subscribe([t.tasks])
        consumer.poll(timeout_ms=3000)
        consumer.commit()
    finally:
        consumer.close()


def test_a_rollout_login_cannot_write_what_training_reads_and_nothing_lands(broker, lab):
    t = Topics("lab")
    for topic in (t.ready, t.weights, t.expert):
        with pytest.raises(TopicAuthorizationFailedError):
            send(broker, "lab-rollout", topic)
    assert record_counts(lab, [t.expert]) == {t.expert: 0}
    before = record_counts(lab, [t.ready])[t.ready]
    widened = Acl("User:lab-rollout", "topic", "literal", t.expert, "Write")
    apply(lab, [widened])
    send(broker, "lab-rollout", t.expert)  # the same call goes through once the ACL allows it
    assert record_counts(lab, [t.expert, t.ready]) == {t.expert: 1, t.ready: before}


def test_a_rollout_login_cannot_commit_the_trainers_group_or_read_another_namespace(broker, lab):
    t = Topics("lab")
    consumer = connect(KafkaConsumer, login(broker, "lab-rollout"), group_id="undertow-trainer",
                       enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(t.tasks, 0)])
        with pytest.raises(GroupAuthorizationFailedError):
            consumer.commit({TopicPartition(t.tasks, 0): _offset(0)})
    finally:
        consumer.close()
    theirs = TopicPartition(Topics("other").tasks, 0)
    send(broker, "admin", theirs.topic)  # something to read, were it allowed
    other = connect(KafkaConsumer, login(broker, "lab-rollout"), group_id=None, auto_offset_reset="earliest")
    try:
        other.assign([theirs])
        assert other.poll(timeout_ms=3000) == {}  # kafka-python logs the refusal and returns nothing
        with pytest.raises(TopicAuthorizationFailedError):
            other.end_offsets([theirs])
        # What a component says when it finds its topic hidden so: the login and the way out, not "missing".
        with pytest.raises(TopicNotFound, match="or the broker hides it from User:lab-rollout"):
            topic_partitions(other, theirs.topic)
    finally:
        other.close()


def test_a_processor_refused_its_source_says_so_in_one_line(broker, lab, tmp_path):
    """`undertow process` on another namespace with lab's processors login: the broker hides other's raw
    topic, and the command ends with the login and the way out, not a traceback."""
    login_of_lab = login(broker, "lab-processors").model_dump(exclude_none=True)
    path = write_config(tmp_path / "other.yaml", "other", kafka=login_of_lab)
    out = CliRunner().invoke(app, ["process", str(path)], env={"UNDERTOW_BOOTSTRAP": None})
    assert out.exit_code == 2, (out.output, out.exception)  # a traceback's exit is 1
    said = " ".join(out.output.split())
    assert said.startswith("error: topic other.experiences.raw does not exist, or the broker hides it from "
                           "User:lab-processors"), said


def test_applying_acls_without_the_right_to_fails_naming_the_refusal(broker, lab):
    rule = Acl("User:lab-rollout", "topic", "literal", Topics("lab").ready, "Write")
    with pytest.raises(AclsRefused, match="refused 1 of 1"):
        apply(login(broker, "lab-rollout"), [rule])


def _offset(position: int):
    from kafka.structs import OffsetAndMetadata

    return OffsetAndMetadata(position, "", -1)


def test_the_generated_acls_are_the_ones_applied(lab, tmp_path):
    """What the broker holds for lab's principals is what `undertow acls` printed."""
    from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, \
        ResourcePatternFilter, ResourceType

    from undertow.streams.admin import admin_client

    path = write_config(tmp_path / "run.yaml", "lab")
    wanted = {r for rules in run_acls(str(path)).values() for r in rules}
    with admin_client(lab) as admin:
        held, error = admin.describe_acls(ACLFilter(principal=None, host=None, operation=ACLOperation.ANY,
                                                    permission_type=ACLPermissionType.ANY,
                                                    resource_pattern=ResourcePatternFilter(
                                                        ResourceType.ANY, None, ACLResourcePatternType.ANY)))
    names = {ACLOperation.READ: "Read", ACLOperation.WRITE: "Write", ACLOperation.DESCRIBE: "Describe",
             ACLOperation.CREATE: "Create", ACLOperation.ALTER: "Alter", ACLOperation.DESCRIBE_CONFIGS: "DescribeConfigs"}
    got = {Acl(a.principal, "topic" if a.resource_pattern.resource_type == ResourceType.TOPIC else "group",
               "literal" if a.resource_pattern.pattern_type == ACLResourcePatternType.LITERAL else "prefixed",
               a.resource_pattern.resource_name, names[a.operation]) for a in held}
    assert wanted <= got  # the widening test above may have added its one rule
    assert got - wanted <= {Acl("User:lab-rollout", "topic", "literal", "lab.experiences.expert", "Write")}


def scram(broker: LocalKafka, user: str, password: str) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=broker.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                         sasl_mechanism="SCRAM-SHA-512", sasl_username=user, sasl_password=password)


def read_tasks(settings: KafkaSettings, topic: str, at_most: int) -> list[bytes]:
    """Up to `at_most` records of the rollout group on `topic`, committed."""
    consumer = connect(KafkaConsumer, settings, group_id="lab.rollout", enable_auto_commit=False,
                       auto_offset_reset="earliest", max_poll_records=at_most)
    try:
        consumer.subscribe([topic])
        got = wait_for(lambda: [r.value for rs in consumer.poll(timeout_ms=1000).values() for r in rs], 60,
                       f"records of {topic} for the rollout group")
        consumer.commit()
        return got
    finally:
        consumer.close()


def test_a_rotated_password_locks_the_old_one_out_and_the_component_goes_on_where_it_left_off(broker, lab):
    """The procedure the README gives: set the new password, restart the component with it; the
    group's committed offsets carry it on. `undertow run` rotates so at every start."""
    t = Topics("rotation")
    create_topics(lab, "rotation")
    apply(lab, [Acl("User:lab-rollout", "topic", "literal", t.tasks, "Read")])
    for i in range(4):
        send(broker, "admin", t.tasks)
    set_logins(lab, {"lab-rollout": "first-pw"})
    assert len(read_tasks(scram(broker, "lab-rollout", "first-pw"), t.tasks, 2)) == 2
    set_logins(lab, {"lab-rollout": "second-pw"})
    with pytest.raises(KafkaUnreachable, match="as SASL user 'lab-rollout'"):
        RecordProducer(scram(broker, "lab-rollout", "first-pw"), bootstrap_timeout_ms=3000)
    assert len(read_tasks(scram(broker, "lab-rollout", "second-pw"), t.tasks, 10)) == 2  # the other two
    remove_logins(lab, ["lab-rollout"])
    with pytest.raises(KafkaUnreachable, match="as SASL user 'lab-rollout'"):
        RecordProducer(scram(broker, "lab-rollout", "second-pw"), bootstrap_timeout_ms=3000)


def throttled_ms(user: str, broker: LocalKafka, topic: str) -> float:
    """The most the broker throttled `user`'s producer over 150 KB (its quota's doing)."""
    p = producer(broker, user)
    try:
        for _ in range(15):
            p.send(topic, b"x" * 10_000, key=b"k")
        p.flush(timeout=120)
        return max(v for group in p.metrics().values() for k, v in group.items() if k == "throttle-time-max")
    finally:
        p.close(timeout=5)


def test_a_produce_quota_throttles_the_rollout_and_not_the_trainer(broker, lab):
    t = Topics("lab")
    set_quotas(lab, {"lab-rollout": Quota(produce_bytes_per_s=10_000)})
    try:
        # A new client's rate is measured over the broker's whole quota window (11 samples of 1 s): 150 KB
        # is 15 KB/s over it, above the 10 KB/s allowed, so the broker holds the producer back.
        assert throttled_ms("lab-rollout", broker, t.raw) > 0
        assert throttled_ms("lab-trainer", broker, t.weights) == 0
    finally:
        set_quotas(lab, {"lab-rollout": Quota()})  # removed: the module's other tests produce as it
