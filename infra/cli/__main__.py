"""`python -m undertow.infra.cli`: what `undertow run` starts its children with, in either environment."""

from undertow.infra.cli import main

main()
