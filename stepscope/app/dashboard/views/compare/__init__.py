"""The Compare page: two runs side by side, operator by operator, and what differs
between their commands and settings."""
