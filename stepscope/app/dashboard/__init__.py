"""The Streamlit dashboard: ``main.py`` is the script `streamlit run` starts; the pages
are in ``views/``, and the modules beside them hold what the pages share (data access,
charts, widgets, the sections of the run and Optimize pages)."""
