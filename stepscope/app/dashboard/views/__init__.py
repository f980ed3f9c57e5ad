"""The dashboard pages (Streamlit scripts run by ``st.navigation`` in ``main.py``)."""
