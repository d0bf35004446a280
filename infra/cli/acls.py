"""`undertow acls CONFIG`: each component's principal and the ACLs that grant it exactly what it needs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
import yaml

from undertow.infra.cli.common import BootstrapOpt, cluster, console, user_errors
from undertow.infra.cli.config import ConfigArg


def acls(config: Path = ConfigArg,
         apply: bool = typer.Option(False, "--apply", help="Create them on the config's cluster (the login must "
                                                           "be allowed to alter ACLs: a super user)."),
         bootstrap: Optional[str] = BootstrapOpt,
         strimzi: bool = typer.Option(False, "--strimzi", help="Print Strimzi KafkaUser manifests instead."),
         kafka_name: str = typer.Option("undertow", "--cluster",
                                        help="--strimzi: the Kafka resource's name (strimzi.io/cluster)."),
         k8s_namespace: str = typer.Option("undertow", help="--strimzi: the Kubernetes namespace.")) -> None:
    """One principal per component (User:<namespace>-<component>) and its allow rules: topics read and
    written, consumer groups, the processors' own topics, the operator's namespace; nothing on the cluster.
    --apply sets `access.quotas` too."""
    from undertow.infra.run.access import run_acls, run_quotas, strimzi_users
    from undertow.infra.run.config import load_run_config
    from undertow.streams import access

    with user_errors():
        if apply:
            kafka, _ = cluster(config, bootstrap, None)
            rules = [r for principal_rules in run_acls(str(config)).values() for r in principal_rules]
            quotas = run_quotas(load_run_config(config)[0])
            console.print(f"created {access.apply(kafka, rules)} ACLs on {kafka.bootstrap_servers}", highlight=False)
            if quotas:
                access.set_quotas(kafka, quotas)
                console.print(f"set the quotas of {', '.join(sorted(quotas))}", highlight=False)
            return
        if strimzi:
            console.print(yaml.safe_dump_all(strimzi_users(str(config), kafka_name, k8s_namespace), sort_keys=False),
                          highlight=False, markup=False, soft_wrap=True, end="")
            return
        for principal, rules in run_acls(str(config)).items():
            console.print(principal, highlight=False, markup=False)
            for r in rules:
                console.print(f"  {r.operation:<16}{r.resource:<7}{r.pattern:<10}{r.name}",
                              highlight=False, markup=False, soft_wrap=True)
