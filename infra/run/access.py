"""Each component's needs on the broker for a run config, from the topic catalog and the group names
the config resolves to: what `undertow acls` prints and the Strimzi KafkaUser manifests carry.

One principal per component and run: `User:<namespace>-<component>`; a staged run's principals hold
the grants of every stage's namespace. Who reads and writes what (infra's reading of the code; the
refusal tests on a broker with the authorizer on are what prove it):

    feeder      writes tasks; reads tasks (what it published) and task-stats; watches the rollout group
    rollout     reads tasks (its group) and weights; writes experiences.raw
    processors  reads experiences.raw (its group, the Faust app id); writes ready and task-stats;
                owns the topics under `<app id>-` (Faust's changelogs and leader topic)
    trainer     reads ready and expert (its group); writes weights
    eval        reads weights; writes evals
    archive     reads the topics it archives (its group)
    monitor     reads metrics (its group) and weights; watches every group and topic of the run (lag)
    watchers    read what each watcher reads (a group each)
    serve       reads weights; writes experiences.raw
    shadow-S    a shadow trainer and its evaluator: read ready and expert (their group) and their own
                weights; write their own weights, rejected and evals
    operator    `undertow run`'s supervisor and a person's commands (topics create, load, replay, tail,
                status): creates, grows, describes, reads and writes the namespace's topics and the
                processors' own, watches every group. Trusted: it can write anything the run trains on
and every one writes metrics and experiences.rejected (its dead letters).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Callable, Iterator

from undertow.infra.run.config import RunConfig, load_run_config, stage_config
from undertow.processors.config import processors_group
from undertow.rollout.config import rollout_group
from undertow.streams.access import SCRAM, Acl, Needs, Quota, acls, apply, needs, set_logins, set_quotas
from undertow.streams.settings import KafkaSettings
from undertow.streams.topics import Topics
from undertow.watchers.config import watcher_specs


# What `undertow run` gives each component it starts (its stage config names them as ${...}): a SCRAM
# login, or the files of a client certificate (access.login).
LOGIN_USERNAME_ENV, LOGIN_PASSWORD_ENV = "UNDERTOW_LOGIN_USERNAME", "UNDERTOW_LOGIN_PASSWORD"
LOGIN_CERTFILE_ENV, LOGIN_KEYFILE_ENV = "UNDERTOW_LOGIN_CERTFILE", "UNDERTOW_LOGIN_KEYFILE"


def user(namespace: str, component: str) -> str:
    return f"{namespace}-{component}"


def principal(namespace: str, component: str) -> str:
    return f"User:{user(namespace, component)}"


def component_of(child_name: str) -> str:
    """The principal's component for a child `undertow run` starts: `trainer@gspo` and `eval@gspo` are
    shadow-gspo's, `watch` the watchers'."""
    role, _, shadow = child_name.partition("@")
    return f"shadow-{shadow}" if shadow else {"watch": "watchers"}.get(role, role)


def stage_needs(cfg: RunConfig) -> dict[str, Needs]:
    """component → its needs in one stage's namespace."""
    ns = cfg.namespace
    t = Topics(ns)
    told = (t.metrics, t.rejected)  # everyone reports and dead-letters
    rollout = rollout_group(ns, cfg.rollout.consumer_group)
    processors = processors_group(ns, cfg.processors.app_id)
    trainer, archive, monitor = cfg.trainer.consumer_group, cfg.archive.consumer_group, f"{ns}-monitor"
    watchers = watcher_specs(cfg.watchers)
    shadows = {s.name: (Topics(ns, shadow=s.name), f"{trainer}.shadow-{s.name}") for s in cfg.shadows}
    every_group = {rollout, processors, trainer, archive, monitor, *(w.group(ns) for w in watchers),
                   *(group for _, group in shadows.values())}
    out = {
        "feeder": needs(reads=(t.tasks, t.task_stats), writes=(t.tasks, *told),
                        watches=(rollout_group(ns, cfg.feeder.consumer_group),)),
        "rollout": needs(reads=(t.tasks, t.weights), writes=(t.raw, *told), groups=(rollout,)),
        "processors": needs(reads=(t.raw,), writes=(t.ready, t.task_stats, *told), groups=(processors,),
                            owns=(f"{processors}-",)),
        "trainer": needs(reads=(t.ready, t.expert), writes=(t.weights, *told), groups=(trainer,)),
        "eval": needs(reads=(t.weights,), writes=(t.evals, *told)),
        "archive": needs(reads=[t.specs_by_suffix()[s] for s in cfg.archive.topics], groups=(archive,)),
        "monitor": needs(reads=(t.metrics, t.weights), writes=told, groups=(monitor,), watches=every_group,
                         inspects=(f"{ns}.",)),
        "serve": needs(reads=(t.weights,), writes=(t.raw, *told)),
        "operator": needs(reads=(t.metrics,), writes=told, watches=every_group,
                          administers=(f"{ns}.", f"{processors}-")),
    }
    if watchers:
        out["watchers"] = needs(reads=[name for w in watchers for name in w.topics(ns)], writes=(t.metrics,),
                                groups=[w.group(ns) for w in watchers])
    for name, (own, group) in shadows.items():
        out[f"shadow-{name}"] = needs(reads=(t.ready, t.expert, own.weights), groups=(group,),
                                      writes=(own.weights, own.rejected, own.evals, t.metrics))
    return out


def run_needs(path: str) -> tuple[str, dict[str, Needs]]:
    """(the run's namespace, component → its needs over every stage) for the run config at `path`."""
    return config_needs(*load_run_config(path))


def config_needs(config: RunConfig, raw: dict[str, Any]) -> tuple[str, dict[str, Needs]]:
    """`run_needs` of a loaded config and its raw mapping."""
    stages = [stage_config(raw, stage) for stage in config.run.stages] or [config]
    merged: dict[str, Needs] = {}
    for cfg in stages:
        for component, wanted in stage_needs(cfg).items():
            merged[component] = merged.get(component, Needs()) | wanted
    return config.namespace, merged


def run_acls(path: str) -> dict[str, list[Acl]]:
    """principal → its ACLs, for the run config at `path`."""
    namespace, wanted = run_needs(path)
    return {principal(namespace, c): acls(principal(namespace, c), n) for c, n in sorted(wanted.items())}


def strimzi_users(path: str, cluster: str, k8s_namespace: str) -> Iterator[dict]:
    """One Strimzi KafkaUser per principal (SCRAM-SHA-512, or with `access.login: certificate` a client
    certificate the User Operator issues; `simple` authorization) carrying its ACLs and `access.quotas`."""
    config = load_run_config(path)[0]
    quotas = run_quotas(config)
    authentication = {"type": "tls" if config.access.login == "certificate" else "scram-sha-512"}
    for name, rules in run_acls(path).items():
        operations: dict[tuple[str, str, str], list[str]] = {}
        for r in rules:
            operations.setdefault((r.resource, r.name, r.pattern), []).append(r.operation)
        spec = {"authentication": authentication,
                "authorization": {"type": "simple", "acls": [
                    {"resource": {"type": kind, "name": resource,
                                  "patternType": "literal" if pattern == "literal" else "prefix"},
                     "operations": ops, "host": "*"}
                    for (kind, resource, pattern), ops in sorted(operations.items())]}}
        quota = quotas.get(name.removeprefix("User:"))
        if quota:
            spec["quotas"] = {key: int(value) for key, value in (("producerByteRate", quota.produce_bytes_per_s),
                                                                 ("consumerByteRate", quota.fetch_bytes_per_s)) if value}
        yield {"apiVersion": "kafka.strimzi.io/v1", "kind": "KafkaUser",
               "metadata": {"name": name.removeprefix("User:"), "namespace": k8s_namespace,
                            "labels": {"strimzi.io/cluster": cluster}},
               "spec": spec}


def run_quotas(config: RunConfig) -> dict[str, Quota]:
    """SCRAM user → its quota, from `access.quotas`."""
    return {user(config.namespace, c): q for c, q in config.access.quotas.items()}


def grant(operator: KafkaSettings, config: RunConfig, raw: dict[str, Any],
          issue: Callable[[str], tuple[Path, Path]] | None = None) -> dict[str, dict[str, str]]:
    """As the operator (a super user): every component's ACLs, its quotas and a login made for this
    start: a SCRAM user with a fresh password (the earlier one stops working), or with `issue` (user →
    certificate and key files) a client certificate. component → the environment that logs it in."""
    namespace, wanted = config_needs(config, raw)
    apply(operator, [r for c, n in wanted.items() for r in acls(principal(namespace, c), n)])
    components = [c for c in sorted(wanted) if c != "operator"]
    if issue:
        logins = {c: dict(zip((LOGIN_CERTFILE_ENV, LOGIN_KEYFILE_ENV), map(str, issue(user(namespace, c)))))
                  for c in components}
    else:
        logins = {c: {LOGIN_USERNAME_ENV: user(namespace, c), LOGIN_PASSWORD_ENV: secrets.token_urlsafe(24)}
                  for c in components}
        set_logins(operator, {env[LOGIN_USERNAME_ENV]: env[LOGIN_PASSWORD_ENV] for env in logins.values()})
    set_quotas(operator, run_quotas(config))
    return logins


def login_references(operator: KafkaSettings, certificates: bool) -> dict[str, str]:
    """The `kafka:` settings every stage config carries under a login per component: the cluster's
    protocol and CA as the operator reaches it, and the login as references to what `grant` gives."""
    refs = {"security_protocol": operator.security_protocol,
            **({"ssl_cafile": operator.ssl_cafile} if operator.ssl_cafile else {})}
    if certificates:
        return {**refs, "ssl_certfile": f"${{{LOGIN_CERTFILE_ENV}}}", "ssl_keyfile": f"${{{LOGIN_KEYFILE_ENV}}}"}
    return {**refs, "sasl_mechanism": SCRAM, "sasl_username": f"${{{LOGIN_USERNAME_ENV}}}",
            "sasl_password": f"${{{LOGIN_PASSWORD_ENV}}}"}
