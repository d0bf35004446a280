"""The layout's folders install as one package, `undertow` (undertow.schemas, undertow.streams, …):
the checkout keeps its top-level folders, site-packages gets no generic top-level names."""

from setuptools import find_packages, setup

LAYOUT = ("kernel", "schemas", "streams", "processors", "rollout", "trainer", "watchers", "infra")

setup(
    packages=[f"undertow.{name}" for name in find_packages(include=[f"{p}*" for p in LAYOUT])],
    package_dir={f"undertow.{p}": p for p in LAYOUT},
    package_data={"undertow.infra.broker": ["kafka/pom.xml", "kafka/log4j2.properties"]},
)
