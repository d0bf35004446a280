"""Deployment files (Compose, Kubernetes, Dockerfiles) and their offline validation (validate.py)."""
