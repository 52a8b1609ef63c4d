"""Cloud-init templates for hub and node instances on AWS, rendered by a pure function (not built yet)."""
