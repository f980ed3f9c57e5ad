"""The dashboard pages, a folder each: its Streamlit script ``page.py`` (run by
``st.navigation`` in ``main.py``) and the sections and widgets it is made of."""
