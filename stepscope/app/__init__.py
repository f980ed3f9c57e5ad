"""The `stepscope` command line (and, later, the Streamlit dashboard)."""
