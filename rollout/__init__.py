"""Rollout workers: the task feeder, inference engines, workflows and environments, rewards, and the
worker that turns tasks into experiences while hot-swapping weights. See rollout/main.py for entry points."""
