"""The Streamlit dashboard: ``main.py`` is the script `streamlit run` starts; each page
is a folder of ``views/``, and the modules beside them hold what the pages share (data
access, widgets, tables, who may act), with the charts in ``charts/``."""
