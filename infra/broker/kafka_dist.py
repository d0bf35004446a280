"""Apache Kafka from Maven Central: resolve the broker's class path once and cache it."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

POM = Path(__file__).parent / "kafka" / "pom.xml"
LOG4J_CONFIG = Path(__file__).parent / "kafka" / "log4j2.properties"


def kafka_version() -> str:
    """The Kafka version the bundled pom asks Maven for."""
    return re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text()).group(1)


def cache_dir() -> Path:
    """Where undertow keeps what it resolved or built outside the checkout."""
    return Path(os.environ.get("UNDERTOW_CACHE", Path.home() / ".cache" / "undertow"))


def classpath(refresh: bool = False) -> str:
    """The broker's Java class path; runs Maven the first time (or when the pom changes)."""
    key = hashlib.sha256(POM.read_bytes()).hexdigest()[:16]
    out = cache_dir() / f"kafka-{kafka_version()}-{key}.classpath"
    if out.exists() and not refresh:
        cp = out.read_text().strip()
        # The cache file is only as good as ~/.m2: a wiped repository means resolving again.
        if all(Path(jar).exists() for jar in cp.split(os.pathsep)):
            return cp
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (mvn) is needed to resolve Apache Kafka from Maven Central; install it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    proc = subprocess.run(
        [mvn, "-q", "-B", "-f", str(POM), "dependency:build-classpath", f"-Dmdep.outputFile={tmp}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"Maven could not resolve Kafka {kafka_version()}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    tmp.replace(out)
    return out.read_text().strip()


def java() -> str:
    """The java launcher: $JAVA_HOME/bin/java if set, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    exe = Path(home) / "bin" / "java" if home else shutil.which("java")
    if not exe or not Path(exe).exists():
        raise RuntimeError("Java 17+ is needed to run the Kafka broker; set JAVA_HOME or put java on PATH")
    return str(exe)
