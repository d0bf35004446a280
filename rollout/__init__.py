"""rollout — see DESIGN.md."""
