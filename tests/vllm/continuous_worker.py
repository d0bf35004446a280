"""A rollout worker on the vllm_async engine in a process of its own (the SIGKILL test kills it):

    python -m tests.vllm.continuous_worker CONFIG NAME

The broker is $UNDERTOW_BOOTSTRAP (the test session's). It works until killed.
"""

from __future__ import annotations

import logging
import sys

from undertow.streams import KafkaSettings
from undertow.rollout.worker import RolloutWorker
from tests.helpers import load_run

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    config, context = load_run(sys.argv[1], KafkaSettings().with_env())
    RolloutWorker(config.rollout, context, sys.argv[2]).run()
