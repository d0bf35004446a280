"""Who may do what on the log: a component's needs, as the broker's ACLs; its SCRAM login and quotas.

A component reads some topics, writes others, commits offsets in its own consumer groups, looks at
other groups' lag, and (the processors, through Faust) keeps topics of its own under a prefix. Each
need becomes the narrowest ACL Kafka has for it (Kafka's operations: READ and WRITE imply DESCRIBE;
committing offsets is READ on the group and the topic; reading a group's offsets is DESCRIBE on it;
an idempotent producer needs no IDEMPOTENT_WRITE once it may WRITE a topic, KIP-679). Nothing here is
granted on the cluster: listing groups without it returns the ones a principal may DESCRIBE.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from undertow.streams.settings import KafkaSettings

Resource = Literal["topic", "group"]
Pattern = Literal["literal", "prefixed"]

READ, WRITE, DESCRIBE, CREATE, ALTER = "Read", "Write", "Describe", "Create", "Alter"
DESCRIBE_CONFIGS = "DescribeConfigs"


class AclsRefused(RuntimeError):
    """The broker did not create some ACLs: it runs no authorizer, or the login may not alter them."""


@dataclass(frozen=True, order=True)
class Acl:
    """One allow rule: `principal` may do `operation` on the topic or group `name` (or every name
    starting with it, when `pattern` is prefixed), from any host."""

    principal: str
    resource: Resource
    pattern: Pattern
    name: str
    operation: str


@dataclass(frozen=True)
class Needs:
    """What one component asks of the broker, by full topic and group names.

    reads / writes: topics it fetches from / produces to; groups: the consumer groups it joins or
    commits offsets in; watches: groups whose offsets it only reads (lag); owns: topic prefixes it
    creates and uses itself (Faust's changelogs); administers: topic prefixes it creates, grows,
    describes, reads and writes (the operator's: a person's commands load, replay and tail);
    inspects: topic prefixes whose offsets it only reads (the monitor's lag)."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    watches: frozenset[str] = frozenset()
    owns: frozenset[str] = frozenset()
    administers: frozenset[str] = frozenset()
    inspects: frozenset[str] = frozenset()

    def __or__(self, other: "Needs") -> "Needs":
        return Needs(*(getattr(self, f) | getattr(other, f) for f in self.__dataclass_fields__))


def needs(*, reads: Iterable[str] = (), writes: Iterable[str] = (), groups: Iterable[str] = (),
          watches: Iterable[str] = (), owns: Iterable[str] = (), administers: Iterable[str] = (),
          inspects: Iterable[str] = ()) -> Needs:
    """A `Needs` from any iterables (None entries, a feature switched off, are left out)."""
    def kept(names: Iterable[str | None]) -> frozenset[str]:
        return frozenset(n for n in names if n)
    return Needs(kept(reads), kept(writes), kept(groups), kept(watches), kept(owns), kept(administers), kept(inspects))


def acls(principal: str, wanted: Needs) -> list[Acl]:
    """The ACLs that grant `wanted` to `principal` and nothing more, sorted."""
    rules = {Acl(principal, "topic", "literal", t, READ) for t in wanted.reads}
    rules |= {Acl(principal, "topic", "literal", t, WRITE) for t in wanted.writes}
    rules |= {Acl(principal, "group", "literal", g, READ) for g in wanted.groups}
    rules |= {Acl(principal, "group", "literal", g, DESCRIBE) for g in wanted.watches - wanted.groups}
    rules |= {Acl(principal, "topic", "prefixed", p, op) for p in wanted.owns for op in (CREATE, READ, WRITE)}
    rules |= {Acl(principal, "topic", "prefixed", p, op) for p in wanted.administers
              for op in (CREATE, ALTER, DESCRIBE_CONFIGS, READ, WRITE)}
    rules |= {Acl(principal, "topic", "prefixed", p, DESCRIBE) for p in wanted.inspects - wanted.administers}
    return sorted(rules)


def allowed(rules: Iterable[Acl], principal: str, resource: Resource, name: str, operation: str) -> bool:
    """Whether `rules` let `principal` do `operation` on `name`, as the broker decides it (READ or WRITE
    grant DESCRIBE too): for checking a grant without a broker."""
    implied = {DESCRIBE: {DESCRIBE, READ, WRITE, ALTER}}.get(operation, {operation})
    return any(r.principal == principal and r.resource == resource and r.operation in implied
               and (r.name == name if r.pattern == "literal" else name.startswith(r.name)) for r in rules)


def apply(settings: "KafkaSettings", rules: Iterable[Acl], timeout_s: float = 30.0) -> int:
    """Create `rules` on the cluster through the admin API (an ACL that exists is left as it is) and
    return once the broker enforces them; returns how many were sent. Raises AclsRefused with the
    broker's reasons when it refused any (it runs no authorizer, or `settings` log in as a principal
    that may not alter ACLs)."""
    from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType,
                             ResourcePattern, ResourcePatternFilter, ResourceType)

    from undertow.streams.admin import admin_client

    operations = {READ: ACLOperation.READ, WRITE: ACLOperation.WRITE, DESCRIBE: ACLOperation.DESCRIBE,
                  CREATE: ACLOperation.CREATE, ALTER: ACLOperation.ALTER, DESCRIBE_CONFIGS: ACLOperation.DESCRIBE_CONFIGS}
    rules = list(rules)
    wanted = [ACL(principal=r.principal, host="*", operation=operations[r.operation],
                  permission_type=ACLPermissionType.ALLOW,
                  resource_pattern=ResourcePattern(ResourceType.TOPIC if r.resource == "topic" else ResourceType.GROUP,
                                                   r.name, ACLResourcePatternType.LITERAL if r.pattern == "literal"
                                                   else ACLResourcePatternType.PREFIXED)) for r in rules]
    key = lambda a: (a.principal, a.operation, a.resource_pattern.resource_type,  # noqa: E731
                     a.resource_pattern.resource_name, a.resource_pattern.pattern_type)
    everything = ACLFilter(principal=None, host=None, operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
                           resource_pattern=ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY))
    with admin_client(settings) as admin:
        result = admin.create_acls(wanted)
        if result["failed"]:
            reasons = sorted({getattr(e, "__name__", repr(e)) for e in result["failed"]})
            raise AclsRefused(f"the broker refused {len(result['failed'])} of {len(rules)} ACLs: {', '.join(reasons)}")
        # The controller has committed them; a broker's authorizer applies them when it replays the
        # metadata log, a moment later, and a client let in by them in that moment was refused
        # (InitProducerId: ClusterAuthorizationFailed). A broker describes ACLs from its authorizer.
        deadline = time.monotonic() + timeout_s
        while missing := {key(a) for a in wanted} - {key(a) for a in admin.describe_acls(everything)[0]}:
            if time.monotonic() > deadline:
                raise AclsRefused(f"{len(missing)} of {len(rules)} ACLs created but not enforced by the broker "
                                  f"after {timeout_s:g} s, e.g. {sorted(missing, key=str)[0]}")
            time.sleep(0.1)
    return len(rules)


SCRAM = "SCRAM-SHA-512"


class Quota(BaseModel):
    """A principal's byte-rate ceilings, enforced per broker (Kafka's user quotas); None: no ceiling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    produce_bytes_per_s: float | None = Field(None, gt=0, description="producer_byte_rate; null: none")
    fetch_bytes_per_s: float | None = Field(None, gt=0, description="consumer_byte_rate; null: none")


def set_logins(settings: "KafkaSettings", passwords: dict[str, str]) -> None:
    """Create or replace each user's SCRAM-SHA-512 credential (the old password stops working for new
    connections) and return once the brokers accept the new ones."""
    from kafka.admin import UserScramCredentialUpsertion

    from undertow.streams.admin import admin_client

    with admin_client(settings) as admin:
        refused = {u: e for u, e in admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(u, SCRAM, p) for u, p in passwords.items()]).items() if e}
    if refused:
        raise AclsRefused(f"the broker refused the logins of {sorted(refused)}: {sorted(set(refused.values()))}")
    _until_accepted(settings, passwords)


def remove_logins(settings: "KafkaSettings", users: Iterable[str]) -> None:
    """Delete the users' SCRAM credentials: they can no longer log in (what is connected stays until
    its connection ends, or `connections.max.reauth.ms` on the broker)."""
    from kafka.admin import UserScramCredentialDeletion

    from undertow.streams.admin import admin_client

    with admin_client(settings) as admin:
        refused = {u: e for u, e in admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion(u, SCRAM) for u in users]).items() if e}
    if refused:
        raise AclsRefused(f"the broker refused to remove the logins of {sorted(refused)}: {sorted(set(refused.values()))}")


def set_quotas(settings: "KafkaSettings", quotas: dict[str, Quota], timeout_s: float = 30.0) -> None:
    """Set each user's produce and fetch byte-rate quotas (a None ceiling removes that quota) and
    return once the broker enforces them."""
    from kafka.protocol.admin import AlterClientQuotasRequest

    from undertow.streams.admin import admin_client

    keys = (("producer_byte_rate", "produce_bytes_per_s"), ("consumer_byte_rate", "fetch_bytes_per_s"))
    entries = [([("user", user)], [(key, float(getattr(q, field) or 0), getattr(q, field) is None) for key, field in keys])
               for user, q in quotas.items()]
    if not entries:
        return
    request = AlterClientQuotasRequest(entries=entries, validate_only=False)
    with admin_client(settings) as admin:  # kafka-python 3.0 has the request but no admin method for it
        send = lambda r: admin._manager.run(admin._manager.send, r)  # noqa: E731
        response = send(request)
        refused = [(e.entity, e.error_message or e.error_code) for e in response.entries if e.error_code]
        if refused:
            raise AclsRefused(f"the broker refused quotas: {refused}")
        # Committed by the controller, applied by each broker from its metadata a moment later; a broker
        # describes quotas from what it applies.
        wanted = {(user, key): getattr(q, field) for user, q in quotas.items() for key, field in keys}
        deadline = time.monotonic() + timeout_s
        while (held := _quotas_held(send, list(quotas))) != {k: v for k, v in wanted.items() if v is not None}:
            if time.monotonic() > deadline:
                raise AclsRefused(f"quotas set but not applied by the broker after {timeout_s:g} s: it holds {held}")
            time.sleep(0.1)


def _quotas_held(send, users: list[str]) -> dict[tuple[str, str], float]:
    """(user, quota key) → value, as the broker applies them."""
    from kafka.protocol.admin import DescribeClientQuotasRequest

    held = {}
    for user in users:
        response = send(DescribeClientQuotasRequest(components=[("user", 0, user)], strict=True))  # 0: exact match
        for entry in response.entries or []:
            held.update({(user, v.key): v.value for v in entry.values})
    return held


def _until_accepted(settings: "KafkaSettings", passwords: dict[str, str], timeout_s: float = 30.0) -> None:
    """A new credential is committed by the controller and applied by each broker a moment later."""
    from undertow.streams.admin import serving_brokers

    deadline = time.monotonic() + timeout_s
    for user, password in passwords.items():
        login = settings.model_copy(update={"sasl_mechanism": SCRAM, "sasl_username": user, "sasl_password": password})
        while True:
            try:
                serving_brokers(login, request_timeout_ms=5000, reconnect_backoff_max_ms=500, bootstrap_timeout_ms=3000)
                break
            except Exception as e:  # noqa: BLE001 — an authentication failure until the broker has it
                if time.monotonic() > deadline:
                    raise AclsRefused(f"the login of {user} was set but not accepted after {timeout_s:g} s: {e}") from e
                time.sleep(0.2)
