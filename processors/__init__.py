"""processors — see DESIGN.md."""
