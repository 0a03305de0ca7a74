"""jaxcnn dashboard: memory and speed profiles from the profile store.

    streamlit run dashboard/app.py          # or: jaxcnn dashboard [--db PATH]

Reads $JAXCNN_DB (else ./jaxcnn_profiles.sqlite, else the shipped H200 data); the sidebar
chooses another DB. Binds to localhost (dashboard/.streamlit/config.toml, `jaxcnn dashboard`).
"""

import streamlit as st

from jaxcnn.dashboard import ui

st.set_page_config(page_title="jaxcnn profiles", page_icon=":material/speed:", layout="wide")

PAGES = [
    st.Page("pages/runs.py", title="Runs", icon=":material/table_rows:", default=True),
    st.Page("pages/speed.py", title="Speed", icon=":material/speed:"),
    st.Page("pages/roofline.py", title="Roofline", icon=":material/show_chart:"),
    st.Page("pages/memory.py", title="Memory", icon=":material/memory:"),
    st.Page("pages/sparsity.py", title="Sparsity", icon=":material/grid_on:"),
]

navigation = st.navigation(PAGES)
ui.sidebar()
navigation.run()
