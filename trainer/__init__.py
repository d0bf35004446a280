"""trainer — see DESIGN.md."""
